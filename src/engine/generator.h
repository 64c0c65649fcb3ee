// Generator: batched autoregressive generation with a KV cache. Prompts of different lengths are
// left-padded into one batch (positions and an attention mask make padding invisible), prefilled in
// one forward pass, then decoded one token per step for every unfinished sequence.
#pragma once
#include <c10/core/Device.h>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "src/data/tokenizer.h"
#include "src/engine/sampling.h"
#include "src/nn/causal_lm.h"

namespace colossal {

struct GenerationResult {
  std::string text;        // the completion (prompt excluded, stop string excluded)
  int64_t prompt_tokens = 0, completion_tokens = 0;
  std::string finish_reason;   // "eos" | "stop" | "length"
};

// Where the last generate() spent its time: the prefill forward, then the decode steps (each one
// forward of one token per sequence, plus sampling and detokenising).
struct GenerationTiming {
  double prefill_s = 0, decode_s = 0;
  int64_t batch = 0, prefill_tokens = 0, decode_steps = 0;
  int64_t captured_steps = 0, captures = 0;   // decode steps replayed as CUDA graphs, graphs captured
  int64_t kv_cache_bytes = 0;                 // the keys' and values' tensors of every layer (--kv-cache's choice)
};

class Generator {
 public:
  Generator(std::shared_ptr<nn::CausalLM> model, Tokenizer tokenizer, c10::Device device);

  // `on_text(i, piece)` receives each new piece of completion i as soon as it is certain (text that
  // could still turn out to start a stop string is held back until it cannot).
  std::vector<GenerationResult> generate(const std::vector<std::string>& prompts, const SamplingConfig& config,
                                         const std::function<void(size_t, const std::string&)>& on_text = {});
  const GenerationTiming& last_timing() const { return timing_; }
  // Decode steps on a GPU as captured CUDA graphs (decode_graphs.h) where they apply; on by default.
  void set_captured_decoding(bool on) { captured_decoding_ = on; }

 private:
  std::shared_ptr<nn::CausalLM> model_;
  Tokenizer tokenizer_;
  c10::Device device_;
  GenerationTiming timing_;
  bool captured_decoding_ = true;
};

}  // namespace colossal
