// BatchEngine: continuous batching over the paged KV cache (kv_blocks.h), the engine `colossal serve`
// runs. Requests join the running batch between steps and leave it when they finish, so the batch is
// never held back by its longest member. Each step() is one forward over a ragged set of tokens:
//   1. every running sequence whose prompt is done decodes one token (a block is taken when it crosses
//      a block boundary; when none is free the most recently admitted other sequence is preempted: its
//      blocks are freed and it waits at the head of the queue to be recomputed from its tokens, never
//      dropped);
//   2. the rest of the step's token budget goes to prompts, in arrival order, in chunks, so a long prompt
//      is spread over several steps instead of stalling everyone's decoding (chunked prefill).
// Sampling is per request (its own seed), so a request's output does not depend on what it ran beside.
// submit() and cancel() may be called from any thread; step() runs on one (the serving loop).
#pragma once
#include <ATen/core/Generator.h>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "src/data/tokenizer.h"
#include "src/engine/sampling.h"
#include "src/engine/text_stream.h"
#include "src/nn/causal_lm.h"
#include "src/serve/kv_blocks.h"
#include "src/serve/step_plan.h"

namespace colossal::serve {

struct EngineConfig {
  int64_t block_size = 16;        // positions a KV block holds
  int64_t num_blocks = 512;       // the pool (kv_blocks.h); bytes per block: 2 * layers * width * block_size * the dtype's size
  int64_t max_step_tokens = 256;  // tokens one forward may take (decodes first, then prompt chunks)
  int64_t max_running = 16;       // sequences in the running batch at most
  c10::Device device = c10::Device(c10::kCPU);   // where the model is, and so the KV pool
};

struct Completion {
  std::string text;                 // the completion, stop string excluded
  std::vector<int> ids;             // its tokens
  int64_t prompt_tokens = 0;
  std::string finish_reason;        // "stop" (a stop string or the end-of-text token) | "length" | "cancelled"
};

// One generated token as sampled, with its log-probability and (when asked for) the most likely
// alternatives at its position, under the model's distribution before temperature and truncation.
struct TokenEvent {
  int id = 0;
  float logprob = 0;
  std::vector<std::pair<int, float>> top;   // the `logprobs` most likely (id, logprob), best first
};

struct EngineRequest {
  std::vector<int> prompt;          // token ids, at least one
  SamplingConfig sampling;          // greedy or sampled with its seed; max_tokens; stop strings
  int64_t logprobs = -1;            // alternatives per token for on_token (-1: no log-probabilities computed)
  // On the step's thread, in order: each token as sampled, then the text it made certain (maybe none);
  // the end-of-text token is not reported, and a stop string's token is reported before the text that
  // ends at the stop string.
  std::function<void(const TokenEvent&)> on_token;
  std::function<void(const std::string& piece)> on_text;
  std::function<void(const Completion&)> on_done;          // once, at the end
};

struct EngineStats {
  int64_t waiting = 0, running = 0, blocks_used = 0, blocks_total = 0;
  int64_t steps = 0, preemptions = 0, tokens_generated = 0;
  int64_t prompt_tokens = 0;   // computed in prompt chunks, a preempted sequence's recomputation included
  int64_t last_step_tokens = 0, last_step_sequences = 0;
};

class BatchEngine {
 public:
  BatchEngine(std::shared_ptr<nn::CausalLM> model, const Tokenizer& tokenizer, EngineConfig config);
  ~BatchEngine();

  // Queues a request and returns its id. Error (one line) when the prompt is empty, does not leave room
  // for one new token in the model's context, or could never fit the KV pool.
  int64_t submit(EngineRequest request);
  // Ends a request: its blocks are freed at the next step boundary and it finishes "cancelled".
  void cancel(int64_t id);
  // One forward over the scheduled tokens; false when there was nothing to do.
  bool step();
  // Tensor parallelism: each step's plan (and each idle pass) is sent to the other ranks first
  // (step_plan.h); the mirror's stop is the caller's to send.
  void set_mirror(std::shared_ptr<StepMirror> mirror) { mirror_ = std::move(mirror); }
  EngineStats stats() const;
  int64_t context_length() const { return model_->context_length(); }
  int64_t vocab_size() const { return model_->vocab_size(); }

 private:
  struct Sequence;
  void admit_inbox();
  bool schedule(std::vector<Sequence*>& rows, std::vector<int64_t>& counts);
  void preempt(Sequence& s);
  void finish(Sequence& s, const std::string& reason);
  void after_forward(Sequence& s, const at::Tensor& logits);
  void refresh_stats();

  std::shared_ptr<nn::CausalLM> model_;
  const Tokenizer& tokenizer_;
  EngineConfig config_;
  KvBlocks blocks_;
  int64_t allowed_vocab_ = 0;
  std::optional<int> eos_;

  mutable std::mutex inbox_mutex_;
  std::vector<std::unique_ptr<Sequence>> inbox_;
  std::vector<int64_t> cancelled_;
  int64_t next_id_ = 0;

  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::list<std::unique_ptr<Sequence>> running_;   // in admission order
  EngineStats stats_;
  std::shared_ptr<StepMirror> mirror_;
};

}  // namespace colossal::serve
