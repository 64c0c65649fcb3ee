// Opening a checkpoint for generation: see generation_checkpoint.h.
#include "src/engine/generation_checkpoint.h"

#include <spdlog/spdlog.h>

#include "models/registry.h"
#include "src/core/error.h"
#include "src/core/text.h"
#include "src/dist/group.h"
#include "src/engine/tensor_split.h"
#include "src/memory/huge_pages.h"
#include "src/parallel/tensor_parallel_1d.h"
#include "src/quant/quantized_linear.h"

namespace colossal {

GenerationCheckpoint open_generation_checkpoint(const std::string& path, const std::string& command) {
  const std::string dir = resolve_checkpoint(path);
  auto info = read_checkpoint_info(dir);
  if (const std::string task = model_task(info.model); task != "causal_lm")   // before reading anything large
    throw Error(command + " (text generation) needs a causal language model; " + dir + " holds a " + info.model.family +
                " model trained for " + task);
  auto tokenizer = Tokenizer::from_files(info.tokenizer_files, dir);
  if (tokenizer.vocab_size() > info.model.vocab_size)
    throw Error("checkpoint " + dir + ": tokenizer has " + std::to_string(tokenizer.vocab_size()) +
                " pieces but the model only " + std::to_string(info.model.vocab_size) + " rows (mismatched files?)");
  auto quantized = quant::quant_config_of(info.config, dir + "/config.json");
  return {dir, std::move(info), std::move(tokenizer), quantized};
}

void check_generation_split(const std::string& path, int64_t tensor) {
  const std::string dir = resolve_checkpoint(path);
  const CheckpointInfo info = read_checkpoint_info(dir);
  check_tensor_split(info.model, tensor, "--tensor-parallel");
  if (const auto q = quant::quant_config_of(info.config, dir + "/config.json"); q && q->scheme == quant::Scheme::int8_smoothquant)
    throw Error(dir + " is quantized with int8-smoothquant, whose activations are quantized per token over a whole row: split across "
                "ranks it would compute something else (run it as one process; int8-weight and int4-weight split)");
}

std::shared_ptr<nn::CausalLM> load_generation_model(const GenerationCheckpoint& c, const std::string& command, dist::Group* tensor_group,
                                                    bool pack_for_cpu, bool huge_pages) {
  std::shared_ptr<nn::LayerFactory> factory;
  std::shared_ptr<quant::QuantizedLayerFactory> quantized;
  if (c.quantized) quantized = std::make_shared<quant::QuantizedLayerFactory>(*c.quantized);
  const bool split = tensor_group && tensor_group->size() > 1;
  if (split && c.quantized)   // (SmoothQuant was refused by check_generation_split)   // each rank's pieces are quantized layers of the same scheme
    factory = std::make_shared<parallel::TensorParallel1d>(*tensor_group, nn::ParamStorage::allocated, 0, quantized);
  else if (split) factory = std::make_shared<parallel::TensorParallel1d>(*tensor_group);
  else if (quantized) factory = quantized;
  else factory = std::make_shared<nn::LayerFactory>();
  auto model = nn::model_as<nn::CausalLM>(build_model(c.info.model, *factory, /*initialise=*/false), command);
  // A CPU model's weights on huge pages (memory/huge_pages.h): fp32 ones before they are read, so the
  // checkpoint goes straight there; a quantized layer's after packing, which makes new panels.
  const bool huge = pack_for_cpu && huge_pages;
  const auto place = [&](memory::Values values) {
    auto placed = memory::move_to_huge_pages(model->parameters(), values);
    if (placed.bytes > 0)
      spdlog::info("weights: {} in one allocation advised for huge pages (transparent_hugepage: {}{})",
                   human_bytes(static_cast<double>(placed.bytes)), placed.mode, placed.mode == "never" ? ", so on 4 KiB pages" : "");
    return placed;
  };
  {
    memory::HugePagePlacement placed;   // its prefault thread runs while the checkpoint is read
    if (huge && !quantized) placed = place(memory::Values::discard);
    load_model_state(*model, HfWeights::open(c.dir));
  }
  if (quantized && pack_for_cpu) quantized->pack_for_cpu();
  if (huge && quantized) place(memory::Values::keep);
  model->eval();
  return model;
}

namespace {

struct KvCacheChoice {
  const char* name;
  std::optional<at::ScalarType> dtype;
};
constexpr KvCacheChoice kKvCacheChoices[] = {{"auto", std::nullopt}, {"fp32", at::kFloat}, {"fp16", at::kHalf}, {"bf16", at::kBFloat16},
                                             {"int8", at::kChar}};   // int8 rows with a scale each (kv_element.h)

}  // namespace

std::vector<std::string> kv_cache_choices() {
  std::vector<std::string> names;
  for (const auto& c : kKvCacheChoices) names.push_back(c.name);
  return names;
}

std::optional<at::ScalarType> parse_kv_cache(const std::string& value) {
  std::string valid;
  for (const auto& c : kKvCacheChoices) {
    if (value == c.name) return c.dtype;
    valid += (valid.empty() ? "" : ", ") + std::string(c.name);
  }
  throw Error("--kv-cache \"" + value + "\" is not a KV cache dtype (valid: " + valid + ")");
}

}  // namespace colossal
