// GPT-2 configuration conversions: see gpt_config.h.
#include "models/gpt/gpt_config.h"

#include "src/core/error.h"

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
  GptConfig c;
  auto get = [&](const char* key, auto& out, bool required) {
    if (!j.contains(key) || j[key].is_null()) {
      if (required) throw Error(path + ": missing \"" + key + "\" (not a GPT-2 config.json?)");
      return;
    }
    try {
      j.at(key).get_to(out);
    } catch (const nlohmann::json::exception&) {
      throw Error(path + ": \"" + key + "\" has the wrong type");
    }
  };
  std::string type = j.value("model_type", "gpt2");
  if (type != "gpt2") throw Error(path + ": model_type \"" + type + "\" is not gpt2");
  get("n_layer", c.n_layer, true);
  get("n_head", c.n_head, true);
  get("n_embd", c.n_embd, true);
  get("n_positions", c.block_size, true);
  get("vocab_size", c.vocab_size, true);
  get("resid_pdrop", c.dropout, false);
  get("layer_norm_epsilon", c.layer_norm_eps, false);
  get("initializer_range", c.init_std, false);
  if (c.n_head <= 0 || c.n_embd % c.n_head != 0)
    throw Error(path + ": n_head = " + std::to_string(c.n_head) + " does not divide n_embd = " + std::to_string(c.n_embd));
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
