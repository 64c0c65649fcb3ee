// Model registry: family name -> how to build the model from a recipe's [model] section, and how to
// read a family's config.json back. One explicit table (registry.cpp), no static initialisers; the
// engine and the apps know families only through these functions.
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "src/core/recipe.h"
#include "src/nn/factory.h"
#include "src/nn/model.h"

namespace colossal {

// The model the config describes, its parameters from `factory`: initialised from the default
// generator (Model::init_weights) when allocated, shapes only when deferred (the chunk store fills them).
std::shared_ptr<nn::Model> build_model(const Recipe& recipe, nn::LayerFactory& factory);
// The recipe's [model] section is one its family can build: RecipeError at the offending key if not.
void check_model_recipe(const Recipe& recipe);
// `initialise` false: allocated parameters keep uninitialised memory, for a caller about to write every
// one of them (loading a whole checkpoint), which then never pays for drawing random values.
std::shared_ptr<nn::Model> build_model(const ModelConfig& config, nn::LayerFactory& factory, bool initialise = true);
// The task (src/tasks) the trainer trains this model for: "causal_lm", "masked_lm", ...
std::string model_task(const ModelConfig& config);
// Reads a config.json written by save (or by transformers) into a [model] section.
ModelConfig model_config_from_hf(const nlohmann::json& config, const std::string& path);
std::vector<std::string> model_families();
int64_t count_parameters(const ModelConfig& config);   // without allocating the model

// Tokens one training sample puts through the blocks: the recipe's sequence, or what the family derives
// (a ViT's patches and class token).
int64_t tokens_per_sample(const Recipe& recipe);

// Bytes one rank holds for parameters, gradients and optimizer states at the recipe's ZeRO stage and
// precision over `dp` data-parallel ranks (the ZeRO paper's formulas: stage 1 divides the optimizer
// states by dp, stage 2 the gradients too, stage 3 the parameters too; bf16/fp16 keep 2-byte parameters
// and whole gradients beside fp32 master weights sharded like the states), plus a per-micro-batch
// activation estimate.
// With optimizer offload, `optimizer` is the host staging (three chunks' states) and `nvme` the states
// in the offload file.
struct MemoryEstimate {
  int64_t parameters = 0;
  double weights = 0, gradients = 0, optimizer = 0, activations = 0;
  double nvme = 0;   // not in total(): on disk
  double total() const { return weights + gradients + optimizer + activations; }
};
MemoryEstimate estimate_training_memory(const Recipe& recipe, int64_t parameters, int64_t dp = 1);

// Whether the recipe's gradient shards stay in the compute dtype (memory::ZeroOptions::compact_grads):
// bf16 or fp16 at zero = 2 or 3, one micro-batch a step (no accumulation, no pipeline), an optimizer
// that reads 16-bit gradients (AdamW), and the optimizer states off the compute device
// (`states_off_device`: the train plan knows it from the resolved placement; the memory estimate, which
// has no device, takes placement cpu, offload_optimizer = "cpu" or "nvme", and placement auto at zero = 3
// with a device budget or train.device = "cuda"; auto on a GPU picked by device = "auto" it counts at
// 4 bytes, above what the run then holds).
bool compact_gradient_shards(const Recipe& recipe, bool states_off_device);

// ZeRO-3 under a device budget: the least the compute device can train the model with. With the chunks'
// data in host memory (placement cpu or auto), each block's chunks gathered only while it runs: the
// embeddings, final norm and head whole with their gradient buffer, the running block's chunks and the
// next one's (prefetched), one block's gradient chunks and one micro-batch's activations. Placement
// device keeps every shard and state there too: the whole estimate.
double minimum_device_bytes(const Recipe& recipe, int64_t parameters, int64_t dp = 1);

}  // namespace colossal
