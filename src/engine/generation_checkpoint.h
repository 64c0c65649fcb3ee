// What `colossal infer` and `colossal serve` open first: a causal language model's checkpoint or Hugging
// Face directory, its config, its tokenizer (checked against the model's rows) and, for a directory
// `colossal quantize` wrote, how its linear layers are quantized; then the model with its weights.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "src/data/tokenizer.h"
#include "src/engine/checkpoint.h"
#include "src/nn/causal_lm.h"
#include "src/quant/quant_config.h"

namespace colossal {
namespace dist {
class Group;
}

struct GenerationCheckpoint {
  std::string dir;
  CheckpointInfo info;
  Tokenizer tokenizer;
  std::optional<quant::QuantConfig> quantized;
};

// Error naming `command` when the directory holds no causal language model, and the files when the
// tokenizer has more pieces than the model has rows.
GenerationCheckpoint open_generation_checkpoint(const std::string& path, const std::string& command);
// What would make every rank of a --tensor-parallel N job fail, refused before any starts: a split the
// model at `path` does not divide (tensor_split.h), and SmoothQuant, whose activations are quantized per
// token over a whole row (split across ranks it would compute something else).
void check_generation_split(const std::string& path, int64_t tensor);

// The model built with quantized linear layers when the checkpoint is quantized, every weight read from
// it (none drawn at random first), in eval mode on the CPU. With a tensor-parallel group of several
// ranks, this rank's pieces only (parallel/tensor_parallel_1d.h): each whole tensor is read in turn and
// cut, so no rank holds more than its pieces and one tensor. `pack_for_cpu`: quantized layers are
// repacked for the CPU's integer GEMM where it applies (quant::QuantizedLinear::pack_for_cpu), for a
// model that stays on the CPU. `huge_pages`: such a model's weights go onto huge pages
// (memory/huge_pages.h; the command asks memory::huge_pages_wanted).
std::shared_ptr<nn::CausalLM> load_generation_model(const GenerationCheckpoint& c, const std::string& command,
                                                    dist::Group* tensor_group = nullptr, bool pack_for_cpu = true,
                                                    bool huge_pages = false);

// --kv-cache's values, "auto" (nullopt: the model's compute dtype), "fp32", "fp16", "bf16" and "int8", and the
// dtype one names (CausalLM::set_kv_dtype); anything else is an Error naming the valid ones.
std::vector<std::string> kv_cache_choices();
std::optional<at::ScalarType> parse_kv_cache(const std::string& value);

}  // namespace colossal
