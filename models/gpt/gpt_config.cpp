// GPT-2 configuration conversions: see gpt_config.h.
#include "models/gpt/gpt_config.h"

#include <limits>

#include "src/core/error.h"
#include "src/core/json_value.h"
#include "src/core/text.h"

namespace colossal::gpt {

GptConfig from_recipe(const ModelConfig& m) {
  return {m.n_layer, m.n_head, m.n_embd, m.block_size, m.vocab_size, m.dropout, m.bias, m.layer_norm_eps, m.init_std};
}

ModelConfig to_model_config(const GptConfig& c) {
  ModelConfig m;
  m.family = "gpt";
  m.n_layer = c.n_layer, m.n_head = c.n_head, m.n_embd = c.n_embd;
  m.block_size = c.block_size, m.vocab_size = c.vocab_size;
  m.dropout = c.dropout, m.bias = c.bias, m.layer_norm_eps = c.layer_norm_eps, m.init_std = c.init_std;
  return m;
}

nlohmann::json to_hf_config(const GptConfig& c) {
  return {
      {"architectures", {"GPT2LMHeadModel"}},
      {"model_type", "gpt2"},
      {"vocab_size", c.vocab_size},
      {"n_positions", c.block_size},
      {"n_ctx", c.block_size},
      {"n_embd", c.n_embd},
      {"n_layer", c.n_layer},
      {"n_head", c.n_head},
      {"n_inner", nullptr},
      {"activation_function", "gelu_new"},
      {"resid_pdrop", c.dropout},
      {"embd_pdrop", c.dropout},
      {"attn_pdrop", c.dropout},
      {"layer_norm_epsilon", c.layer_norm_eps},
      {"initializer_range", c.init_std},
      {"bos_token_id", 1},
      {"eos_token_id", 2},
      {"tie_word_embeddings", true},
      {"torch_dtype", "float32"},
  };
}

GptConfig from_hf_config(const nlohmann::json& j, const std::string& path) {
  if (!j.is_object()) throw Error(path + ": holds " + std::string(j.type_name()) + ", not a JSON object");
  GptConfig c;
  auto present = [&](const char* key) { return j.contains(key) && !j[key].is_null(); };
  // A size: a whole number in [1, max] (the bounds keep a corrupted file from asking for exabytes).
  auto size = [&](const char* key, int64_t& out, int64_t max) {
    if (!present(key)) throw Error(path + ": missing \"" + key + "\" (not a GPT-2 config.json?)");
    const auto n = whole_number(j[key]);
    if (!n || *n < 1 || *n > static_cast<uint64_t>(max))
      throw Error(path + ": \"" + key + "\" = " + j[key].dump() + " (expected a whole number in [1, " + std::to_string(max) + "])");
    out = static_cast<int64_t>(*n);
  };
  // A real number in [lo, hi) (or (lo, hi) when open_lo), optional.
  auto real = [&](const char* key, double& out, double lo, double hi, bool open_lo) {
    if (!present(key)) return;
    const auto& v = j[key];
    const double x = v.is_number() ? v.get<double>() : std::numeric_limits<double>::quiet_NaN();
    if (!(open_lo ? x > lo : x >= lo) || !(x < hi))
      throw Error(path + ": \"" + key + "\" = " + v.dump() + " (expected a number in " + (open_lo ? "(" : "[") +
                  format_number(lo) + ", " + format_number(hi) + "))");
    out = x;
  };
  // A field this model has one setting of: absent, null, or that setting; anything else is refused,
  // since building the model without it would silently compute something else.
  auto fixed = [&](const char* key, const std::vector<nlohmann::json>& accepted, const std::string& supported) {
    if (!present(key)) return;
    for (const auto& a : accepted)
      if (j[key] == a) return;
    throw Error(path + ": \"" + key + "\" = " + j[key].dump() + " is not supported (" + supported + ")");
  };
  if (j.contains("model_type") && !j["model_type"].is_string())
    throw Error(path + ": \"model_type\" = " + j["model_type"].dump() + " is not a name");
  const std::string type = j.value("model_type", "gpt2");
  if (type != "gpt2") throw Error(path + ": model_type \"" + type + "\" is not gpt2");
  size("n_layer", c.n_layer, 1024);
  size("n_head", c.n_head, 1024);
  size("n_embd", c.n_embd, 1 << 16);
  size("n_positions", c.block_size, 1 << 20);
  size("vocab_size", c.vocab_size, 1 << 24);
  real("resid_pdrop", c.dropout, 0.0, 1.0, false);
  real("layer_norm_epsilon", c.layer_norm_eps, 0.0, 1.0, true);
  real("initializer_range", c.init_std, 0.0, 1.0, true);
  if (c.n_embd % c.n_head != 0)
    throw Error(path + ": n_head = " + std::to_string(c.n_head) + " does not divide n_embd = " + std::to_string(c.n_embd));
  fixed("activation_function", {"gelu_new", "gelu_pytorch_tanh"}, "this GPT-2 uses the tanh GELU: gelu_new or gelu_pytorch_tanh");
  fixed("tie_word_embeddings", {true}, "the LM head shares the token embedding: true");
  fixed("n_inner", {4 * c.n_embd}, "the MLP is 4 x n_embd = " + std::to_string(4 * c.n_embd) + " wide, or null");
  fixed("scale_attn_weights", {true}, "scores are scaled by 1/sqrt(head size): true");
  fixed("scale_attn_by_inverse_layer_idx", {false}, "false");
  fixed("reorder_and_upcast_attn", {false}, "false");
  fixed("add_cross_attention", {false}, "a decoder-only model: false");
  if (present("n_ctx") && j["n_ctx"] != j["n_positions"])
    throw Error(path + ": \"n_ctx\" = " + j["n_ctx"].dump() + " differs from n_positions = " + std::to_string(c.block_size));
  return c;
}

}  // namespace colossal::gpt

namespace colossal::gpt {

int64_t parameter_count(const GptConfig& c) {
  const int64_t e = c.n_embd, b = c.bias ? 1 : 0;
  // Per block: 2 LayerNorms (4C), qkv (3C^2 + 3C), attention out (C^2 + C), MLP (8C^2 + 5C).
  const int64_t block = 4 * e + 12 * e * e + b * 9 * e;
  return c.vocab_size * e + c.block_size * e + c.n_layer * block + 2 * e;
}

}  // namespace colossal::gpt
