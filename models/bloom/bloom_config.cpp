// BLOOM configuration conversions: see bloom_config.h.
#include "models/bloom/bloom_config.h"

#include "src/core/error.h"
#include "src/core/text.h"
#include "src/io/hf_config.h"

namespace colossal::bloom {

BloomConfig from_recipe(const ModelConfig& m) {
  BloomConfig c;
  c.n_layer = m.n_layer, c.n_head = m.n_head, c.n_embd = m.n_embd;
  c.vocab_size = m.vocab_size, c.max_positions = m.block_size;
  c.dropout = m.dropout;
  c.attn_dropout = m.attention_dropout();
  c.layer_norm_eps = m.layer_norm_eps, c.init_std = m.init_std;
  // What BLOOM's architecture fixes: refused by key rather than built as something else.
  if (m.n_inner != 0 && m.n_inner != 4 * m.n_embd)
    throw ModelKeyError("n_inner", "= " + std::to_string(m.n_inner) + " is not BLOOM's MLP width, 4 x n_embd (valid: 0 or " +
                                       std::to_string(4 * m.n_embd) + ")");
  if (m.activation != "auto" && m.activation != "gelu_tanh")
    throw ModelKeyError("activation", "= \"" + m.activation + "\" is not BLOOM's activation, the tanh GELU (valid: \"auto\", \"gelu_tanh\")");
  if (!m.pre_norm) throw ModelKeyError("pre_norm", "= false, but BLOOM's blocks are pre-LN (valid: true)");
  if (!m.bias) throw ModelKeyError("bias", "= false, but BLOOM's linears have biases (valid: true)");
  if (m.embed_dim != 0 && m.embed_dim != m.n_embd)
    throw ModelKeyError("embed_dim", "= " + std::to_string(m.embed_dim) + ", but BLOOM's embeddings are as wide as the model (valid: 0)");
  return c;
}

ModelConfig to_model_config(const BloomConfig& c) {
  ModelConfig m;
  m.family = "bloom";
  m.n_layer = c.n_layer, m.n_head = c.n_head, m.n_embd = c.n_embd;
  m.n_inner = 4 * c.n_embd;
  m.block_size = c.max_positions, m.vocab_size = c.vocab_size;
  m.dropout = c.dropout, m.attn_dropout = c.attn_dropout;
  m.layer_norm_eps = c.layer_norm_eps, m.init_std = c.init_std;
  m.activation = "gelu_tanh";
  return m;
}

nlohmann::json to_hf_config(const BloomConfig& c) {
  return {
      {"architectures", {"BloomForCausalLM"}},
      {"model_type", "bloom"},
      {"vocab_size", c.vocab_size},
      {"hidden_size", c.n_embd},
      {"n_layer", c.n_layer},
      {"n_head", c.n_head},
      {"seq_length", c.max_positions},
      {"layer_norm_epsilon", c.layer_norm_eps},
      {"initializer_range", c.init_std},
      {"hidden_dropout", c.dropout},
      {"attention_dropout", c.attn_dropout},
      {"apply_residual_connection_post_layernorm", false},
      {"pretraining_tp", 1},
      {"slow_but_exact", false},
      {"bos_token_id", c.bos_token_id},
      {"eos_token_id", c.eos_token_id},
      {"pad_token_id", c.pad_token_id},
      {"tie_word_embeddings", true},
      {"use_cache", true},
      {"torch_dtype", "float32"},
  };
}

BloomConfig from_hf_config(const nlohmann::json& j, const std::string& path) {
  const HfConfigReader r(j, path, "bloom", "BLOOM");
  BloomConfig c;
  c.n_layer = r.size("n_layer", 1024);
  c.n_head = r.size("n_head", 1024);
  c.n_embd = r.present("hidden_size") ? r.size("hidden_size", 1 << 17) : r.size("n_embed", 1 << 17);
  c.vocab_size = r.size("vocab_size", 1 << 24);
  c.max_positions = r.size("seq_length", c.max_positions, 1 << 20);
  c.layer_norm_eps = r.real("layer_norm_epsilon", c.layer_norm_eps, 0.0, 1.0, true);
  c.init_std = r.real("initializer_range", c.init_std, 0.0, 1.0, true);
  c.dropout = r.real("hidden_dropout", c.dropout, 0.0, 1.0);
  c.attn_dropout = r.real("attention_dropout", c.attn_dropout, 0.0, 1.0);
  for (auto [key, out] : {std::pair{"bos_token_id", &c.bos_token_id}, {"eos_token_id", &c.eos_token_id}, {"pad_token_id", &c.pad_token_id}})
    *out = r.index(key, *out, c.vocab_size - 1);
  if (c.n_embd % c.n_head != 0)
    r.fail("n_head = " + std::to_string(c.n_head) + " does not divide hidden_size = " + std::to_string(c.n_embd));
  r.fixed("apply_residual_connection_post_layernorm", {false}, "residuals taken before the LayerNorm: false");
  r.fixed("tie_word_embeddings", {true}, "the LM head shares the token embedding: true");
  // pretraining_tp and slow_but_exact only change how transformers slices its matmuls, not the result.
  return c;
}

int64_t parameter_count(const BloomConfig& c) {
  const int64_t e = c.n_embd;
  // Per block: 2 LayerNorms (4C), qkv (3C^2 + 3C), dense (C^2 + C), MLP (8C^2 + 5C).
  const int64_t block = 4 * e + 12 * e * e + 9 * e;
  return c.vocab_size * e + 2 * e + c.n_layer * block + 2 * e;   // + embedding LayerNorm, + ln_f
}

}  // namespace colossal::bloom
