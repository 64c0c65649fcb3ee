// OPT configuration conversions: see opt_config.h.
#include "models/opt/opt_config.h"

#include "models/hf_activation.h"
#include "src/core/error.h"
#include "src/core/text.h"
#include "src/io/hf_config.h"

namespace colossal::opt {
namespace {


}  // namespace

OptConfig from_recipe(const ModelConfig& m) {
  OptConfig c;
  c.n_layer = m.n_layer, c.n_head = m.n_head, c.n_embd = m.n_embd;
  c.ffn_dim = m.n_inner ? m.n_inner : 4 * m.n_embd;
  c.max_positions = m.block_size, c.vocab_size = m.vocab_size;
  c.embed_dim = m.embed_dim ? m.embed_dim : m.n_embd;
  c.pre_norm = m.pre_norm;
  c.dropout = m.dropout;
  c.attn_dropout = m.attention_dropout();
  c.bias = m.bias, c.init_std = m.init_std;
  c.activation = hf_activation_of_recipe(m.activation, "relu");
  if (m.layer_norm_eps != 1e-5)
    throw ModelKeyError("layer_norm_eps", "= " + format_number(m.layer_norm_eps) + ": OPT's LayerNorms use 1e-5 (valid: 1e-5)");
  return c;
}

ModelConfig to_model_config(const OptConfig& c) {
  ModelConfig m;
  m.family = "opt";
  m.n_layer = c.n_layer, m.n_head = c.n_head, m.n_embd = c.n_embd;
  m.n_inner = c.ffn_dim;
  m.block_size = c.max_positions, m.vocab_size = c.vocab_size;
  m.embed_dim = c.embed_dim;
  m.pre_norm = c.pre_norm;
  m.dropout = c.dropout, m.attn_dropout = c.attn_dropout;
  m.bias = c.bias, m.init_std = c.init_std;
  m.activation = recipe_activation_of_hf(c.activation);
  return m;
}

nn::Act activation_of(const OptConfig& c) { return activation_of_hf(c.activation, "OPT"); }

nlohmann::json to_hf_config(const OptConfig& c) {
  return {
      {"architectures", {"OPTForCausalLM"}},
      {"model_type", "opt"},
      {"vocab_size", c.vocab_size},
      {"hidden_size", c.n_embd},
      {"num_hidden_layers", c.n_layer},
      {"num_attention_heads", c.n_head},
      {"ffn_dim", c.ffn_dim},
      {"max_position_embeddings", c.max_positions},
      {"word_embed_proj_dim", c.embed_dim},
      {"do_layer_norm_before", c.pre_norm},
      {"_remove_final_layer_norm", false},
      {"activation_function", c.activation},
      {"dropout", c.dropout},
      {"attention_dropout", c.attn_dropout},
      {"layerdrop", 0.0},
      {"enable_bias", c.bias},
      {"layer_norm_elementwise_affine", true},
      {"init_std", c.init_std},
      {"bos_token_id", c.bos_token_id},
      {"eos_token_id", c.eos_token_id},
      {"pad_token_id", c.pad_token_id},
      {"tie_word_embeddings", true},
      {"use_cache", true},
      {"torch_dtype", "float32"},
  };
}

OptConfig from_hf_config(const nlohmann::json& j, const std::string& path) {
  const HfConfigReader r(j, path, "opt", "OPT");
  OptConfig c;
  c.n_layer = r.size("num_hidden_layers", 1024);
  c.n_head = r.size("num_attention_heads", 1024);
  c.n_embd = r.size("hidden_size", 1 << 17);
  c.ffn_dim = r.size("ffn_dim", 1 << 20);
  c.max_positions = r.size("max_position_embeddings", 1 << 20);
  c.vocab_size = r.size("vocab_size", 1 << 24);
  c.embed_dim = r.size("word_embed_proj_dim", c.n_embd, 1 << 17);
  c.pre_norm = r.flag("do_layer_norm_before", true);
  c.dropout = r.real("dropout", c.dropout, 0.0, 1.0);
  c.attn_dropout = r.real("attention_dropout", c.attn_dropout, 0.0, 1.0);
  c.bias = r.flag("enable_bias", true);
  c.init_std = r.real("init_std", c.init_std, 0.0, 1.0, true);
  c.activation = r.choice("activation_function", "relu", hf_activation_names());
  for (auto [key, out] : {std::pair{"bos_token_id", &c.bos_token_id}, {"eos_token_id", &c.eos_token_id}, {"pad_token_id", &c.pad_token_id}})
    *out = r.index(key, *out, c.vocab_size - 1);
  if (c.n_embd % c.n_head != 0)
    r.fail("num_attention_heads = " + std::to_string(c.n_head) + " does not divide hidden_size = " + std::to_string(c.n_embd));
  r.fixed("layer_norm_elementwise_affine", {true}, "LayerNorms with weight and bias: true");
  r.fixed("_remove_final_layer_norm", {false}, "checkpoints from before transformers 4.20.1 are not read: false");
  r.fixed("tie_word_embeddings", {true}, "the LM head shares the token embedding: true");
  r.fixed("layerdrop", {0, 0.0}, "no stochastic depth: 0");
  return c;
}

int64_t parameter_count(const OptConfig& c) {
  const int64_t e = c.n_embd, f = c.ffn_dim, b = c.bias ? 1 : 0;
  // Per block: 2 LayerNorms (4C), q/k/v/out (4C^2 + 4C), fc1 and fc2 (2CF + F + C).
  const int64_t block = 4 * e + 4 * e * e + 2 * e * f + b * (5 * e + f);
  const int64_t projections = c.embed_dim != e ? 2 * c.embed_dim * e : 0;
  return c.vocab_size * c.embed_dim + (c.max_positions + kPositionOffset) * e + projections + c.n_layer * block +
         (c.pre_norm ? 2 * e : 0);
}

}  // namespace colossal::opt
