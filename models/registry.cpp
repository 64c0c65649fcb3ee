// Model registry: see registry.h.
#include "models/registry.h"

#include "models/bert/bert.h"
#include "models/bloom/bloom.h"
#include "models/gpt/gpt.h"
#include "models/opt/opt.h"
#include "models/vit/vit.h"
#include "src/core/error.h"
#include "src/core/text.h"
#include "src/memory/offloaded_states.h"
#include "src/optim/factory.h"

namespace colossal {
namespace {

std::string causal_lm(const ModelConfig&) { return "causal_lm"; }

struct Family {
  std::string name;
  std::shared_ptr<nn::Model> (*build)(const ModelConfig&, nn::LayerFactory&);
  ModelConfig (*from_hf)(const nlohmann::json&, const std::string&);
  int64_t (*count)(const ModelConfig&);
  std::vector<std::string> hf_model_types;
  std::string (*task)(const ModelConfig&);
  // [model] as the family builds it, with the keys it derives filled in (ViT's sequence and no vocabulary).
  ModelConfig (*canonical)(const ModelConfig&);
};

const std::vector<Family>& families() {
  static const std::vector<Family> table = {
      {"gpt",
       [](const ModelConfig& m, nn::LayerFactory& f) -> std::shared_ptr<nn::Model> {
         return std::make_shared<gpt::Gpt>(gpt::from_recipe(m), f);
       },
       [](const nlohmann::json& j, const std::string& path) { return gpt::to_model_config(gpt::from_hf_config(j, path)); },
       [](const ModelConfig& m) { return gpt::parameter_count(gpt::from_recipe(m)); },
       {"gpt2"},
       causal_lm,
       [](const ModelConfig& m) { return gpt::to_model_config(gpt::from_recipe(m)); }},
      {"opt",
       [](const ModelConfig& m, nn::LayerFactory& f) -> std::shared_ptr<nn::Model> {
         return std::make_shared<opt::Opt>(opt::from_recipe(m), f);
       },
       [](const nlohmann::json& j, const std::string& path) { return opt::to_model_config(opt::from_hf_config(j, path)); },
       [](const ModelConfig& m) { return opt::parameter_count(opt::from_recipe(m)); },
       {"opt"},
       causal_lm,
       [](const ModelConfig& m) { return opt::to_model_config(opt::from_recipe(m)); }},
      {"bloom",
       [](const ModelConfig& m, nn::LayerFactory& f) -> std::shared_ptr<nn::Model> {
         return std::make_shared<bloom::Bloom>(bloom::from_recipe(m), f);
       },
       [](const nlohmann::json& j, const std::string& path) { return bloom::to_model_config(bloom::from_hf_config(j, path)); },
       [](const ModelConfig& m) { return bloom::parameter_count(bloom::from_recipe(m)); },
       {"bloom"},
       causal_lm,
       [](const ModelConfig& m) { return bloom::to_model_config(bloom::from_recipe(m)); }},
      {"bert",
       [](const ModelConfig& m, nn::LayerFactory& f) { return bert::build(bert::from_recipe(m), f); },
       [](const nlohmann::json& j, const std::string& path) { return bert::to_model_config(bert::from_hf_config(j, path)); },
       [](const ModelConfig& m) { return bert::parameter_count(bert::from_recipe(m)); },
       {"bert"},
       [](const ModelConfig& m) -> std::string { return m.head == "classifier" ? "sequence_classification" : "masked_lm"; },
       [](const ModelConfig& m) { return bert::to_model_config(bert::from_recipe(m)); }},
      {"vit",
       [](const ModelConfig& m, nn::LayerFactory& f) -> std::shared_ptr<nn::Model> {
         return std::make_shared<vit::Vit>(vit::from_recipe(m), f);
       },
       [](const nlohmann::json& j, const std::string& path) { return vit::to_model_config(vit::from_hf_config(j, path)); },
       [](const ModelConfig& m) { return vit::parameter_count(vit::from_recipe(m)); },
       {"vit"},
       [](const ModelConfig&) -> std::string { return "image_classification"; },
       [](const ModelConfig& m) { return vit::to_model_config(vit::from_recipe(m)); }},
  };
  return table;
}

const Family* family_named(const std::string& name) {
  for (const auto& f : families())
    if (f.name == name) return &f;
  return nullptr;
}

std::vector<std::string> hf_model_types() {
  std::vector<std::string> types;
  for (const auto& f : families()) types.insert(types.end(), f.hf_model_types.begin(), f.hf_model_types.end());
  return types;
}

}  // namespace

std::vector<std::string> model_families() {
  std::vector<std::string> names;
  for (const auto& f : families()) names.push_back(f.name);
  return names;
}

namespace {

// The family a bare [model] section names (no recipe to point into).
const Family& family_of(const ModelConfig& config) {
  if (const Family* f = family_named(config.family)) return *f;
  throw Error("unknown model family \"" + config.family + "\" (valid: " + join(model_families(), ", ") + ")");
}

const Family& family_of(const Recipe& recipe) {
  if (const Family* f = family_named(recipe.model.family)) return *f;
  std::string hint = nearest_name(recipe.model.family, model_families());
  throw RecipeError(recipe.where("model.family"),
                    "= \"" + recipe.model.family + "\" is not a known model family (valid: " + join(model_families(), ", ") +
                        ")" + (hint.empty() ? "" : " (did you mean \"" + hint + "\"?)"));
}

}  // namespace

std::shared_ptr<nn::Model> build_model(const ModelConfig& config, nn::LayerFactory& factory, bool initialise) {
  auto model = family_of(config).build(config, factory);
  if (initialise && factory.storage() == nn::ParamStorage::allocated) model->init_weights();
  return model;
}

void check_model_recipe(const Recipe& recipe) {
  const Family& f = family_of(recipe);
  try {
    (void)f.count(recipe.model);   // parses the family's own config from [model], which validates it
  } catch (const ModelKeyError& e) {
    throw RecipeError(recipe.where("model." + e.key()), e.message());
  }
}

std::shared_ptr<nn::Model> build_model(const Recipe& recipe, nn::LayerFactory& factory) {
  check_model_recipe(recipe);
  return build_model(recipe.model, factory);
}

std::string model_task(const ModelConfig& config) { return family_of(config).task(config); }

int64_t count_parameters(const ModelConfig& config) { return family_of(config).count(config); }

ModelConfig model_config_from_hf(const nlohmann::json& config, const std::string& path) {
  if (!config.is_object()) throw Error(path + ": holds " + std::string(config.type_name()) + ", not a JSON object");
  if (config.contains("model_type") && !config["model_type"].is_string())   // found by tests/fuzz
    throw Error(path + ": \"model_type\" = " + config["model_type"].dump() + " is not a name (valid: " + join(hf_model_types(), ", ") + ")");
  std::string type = config.value("model_type", "");
  for (const auto& f : families())
    for (const auto& t : f.hf_model_types)
      if (t == type) return f.from_hf(config, path);
  throw Error(path + ": model_type \"" + type + "\" is not supported (valid: " + join(hf_model_types(), ", ") + ")");
}

int64_t tokens_per_sample(const Recipe& r) {
  const int64_t context = family_of(r.model).canonical(r.model).block_size;
  return std::min(r.train.seq_len > 0 ? r.train.seq_len : context, context);
}

namespace {

// A GPT-style transformer block's elements (12 C^2 + 13 C: attention and an MLP four times wider, with
// biases and two norms) and the model's elements outside its blocks (embeddings, final norm, head).
struct BlockSplit {
  double block = 0, outer = 0;
};
BlockSplit block_split(const ModelConfig& m, double parameters) {
  const double c = static_cast<double>(m.n_embd), block = 12 * c * c + 13 * c;
  return {block, std::max(0.0, parameters - static_cast<double>(m.n_layer) * block)};
}

}  // namespace

bool compact_gradient_shards(const Recipe& r, bool states_off_device) {
  return states_off_device && r.precision.dtype != "fp32" && r.memory.zero >= 2 && r.train.grad_accum == 1 && r.parallel.pipeline == 1 &&
         optim::make_optimizer(r.optim)->reads_half_grads();
}

MemoryEstimate estimate_training_memory(const Recipe& r, int64_t parameters, int64_t dp) {
  MemoryEstimate e;
  e.parameters = parameters;
  const double p = static_cast<double>(parameters), shards = static_cast<double>(std::max<int64_t>(dp, 1));
  const int64_t stage = r.memory.zero;
  const double sharded = stage >= 1 ? shards : 1.0;   // what the optimizer side is divided by
  // As the chunk store holds it (src/memory/chunk_store.h): the model's parameters in the compute dtype
  // (bf16/fp16: 2 bytes), and under mixed precision fp32 master weights sharded like the optimizer
  // states; gradients in the compute dtype while whole (stages 0-1, plus an fp32 copy of this rank's
  // shard for the update), in fp32 shards from stage 2, or in compute-dtype shards where
  // compact_gradient_shards holds (the states off the device, as registry.h says this estimate sees it).
  const bool mixed = r.precision.dtype != "fp32";
  const double compute = mixed ? 2 : 4;
  const double master = mixed ? 4 * p / sharded : 0;
  e.weights = (stage >= 3 ? compute * p / shards : compute * p) + master;
  const auto& mem = r.memory;
  const bool states_off_device = mem.placement == "cpu" || mem.offload_optimizer != "none" ||
                                 (mem.placement == "auto" && stage == 3 && (mem.device_memory_limit_gb > 0 || r.train.device == "cuda"));
  e.gradients = stage >= 2 ? (compact_gradient_shards(r, states_off_device) ? compute : 4) * p / shards
                           : compute * p + (mixed ? 4 * p / sharded : 0);
  const auto optimizer = optim::make_optimizer(r.optim);
  const auto states = static_cast<double>(optimizer->state_names().size());
  e.optimizer = 4 * p * states / sharded;
  const ModelConfig m = family_of(r.model).canonical(r.model);
  if (r.memory.offload_optimizer == "nvme") {
    // Three slices are staged: kOffloadSliceNumel elements for an elementwise rule, a whole chunk's
    // shard for LAMB and LARS (a chunk holds at least the largest tensor, the embedding, or the chunk
    // size asked for).
    const double chunk = std::max(static_cast<double>(m.vocab_size) * static_cast<double>(m.n_embd), r.memory.chunk_size_mb * 262144.0);
    const double shard = chunk / sharded;
    const double slice = optimizer->elementwise() ? std::min(static_cast<double>(memory::kOffloadSliceNumel), shard) : shard;
    const bool params = r.memory.offload_params == "nvme";
    const double segments = states + (mixed || params ? 1 : 0);   // the master goes too
    e.nvme = e.optimizer + (params ? 4 * p / shards : master);
    e.weights -= master;
    e.optimizer = std::min(e.nvme, 3 * 4 * slice * segments);
    if (params) {
      // Memory keeps the embeddings, final norm and head whole, and about two blocks' chunks: the one
      // running and the next being read, each with its master read from the file beside it.
      const BlockSplit s = block_split(m, p);
      e.weights = compute * s.outer + 2 * (compute + 4) * s.block;
      if (mixed) e.gradients = compute * p / shards;   // the shards stay in the compute dtype (ChunkStore::compact_grads)
    }
  }
  // Activations kept for backward per layer, in the compute dtype, with fused attention (no T x T
  // scores kept): about 17 values of [B, T, C] per block (inputs of norms, qkv, attention output, MLP
  // in/out with its 4x hidden) plus the logits [B, T, V] and their gradient (fp32). T and V as the
  // family builds the model (a ViT sees its patches and has no vocabulary).
  const double b = static_cast<double>(r.train.batch_size), t = static_cast<double>(tokens_per_sample(r));
  const double c = static_cast<double>(m.n_embd), v = static_cast<double>(m.vocab_size);
  e.activations = compute * b * t * c * 17 * static_cast<double>(m.n_layer) + 4 * 2 * b * t * v;
  return e;
}

double minimum_device_bytes(const Recipe& r, int64_t parameters, int64_t dp) {
  const MemoryEstimate e = estimate_training_memory(r, parameters, dp);
  if (r.memory.placement == "device") return e.total();
  const ModelConfig m = family_of(r.model).canonical(r.model);
  const double compute = r.precision.dtype == "fp32" ? 4 : 2;
  const BlockSplit s = block_split(m, static_cast<double>(parameters));
  return compute * (2 * s.outer + 3 * s.block) + e.activations;
}

}  // namespace colossal
