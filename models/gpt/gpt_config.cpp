// GPT-2 configuration conversions: see gpt_config.h.
#include "models/gpt/gpt_config.h"

#include "src/core/error.h"
#include "src/core/text.h"
#include "src/io/hf_config.h"

namespace colossal::gpt {

GptConfig from_recipe(const ModelConfig& m) {
  // GPT-2's one shape of block: keys other families use must hold GPT-2's values.
  if (m.n_inner != 0 && m.n_inner != 4 * m.n_embd)
    throw ModelKeyError("n_inner", "= " + std::to_string(m.n_inner) + ": a GPT-2 MLP is 4 x n_embd = " + std::to_string(4 * m.n_embd) + " wide (valid: 0 or that)");
  if (m.activation != "auto" && m.activation != "gelu_tanh")
    throw ModelKeyError("activation", "= \"" + m.activation + "\": GPT-2 uses the tanh GELU (valid: auto, gelu_tanh)");
  if (!m.pre_norm) throw ModelKeyError("pre_norm", "= false: GPT-2 blocks normalise before each sublayer (valid: true)");
  if (m.embed_dim != 0 && m.embed_dim != m.n_embd)
    throw ModelKeyError("embed_dim", "= " + std::to_string(m.embed_dim) + ": GPT-2 embeds at the model width (valid: 0 or n_embd)");
  return {m.n_layer, m.n_head, m.n_embd, m.block_size, m.vocab_size, m.dropout, m.bias, m.layer_norm_eps, m.init_std, m.attention_dropout()};
}

ModelConfig to_model_config(const GptConfig& c) {
  ModelConfig m;
  m.family = "gpt";
  m.n_layer = c.n_layer, m.n_head = c.n_head, m.n_embd = c.n_embd;
  m.block_size = c.block_size, m.vocab_size = c.vocab_size;
  m.dropout = c.dropout, m.bias = c.bias, m.layer_norm_eps = c.layer_norm_eps, m.init_std = c.init_std;
  m.attn_dropout = c.attn_dropout == c.dropout ? -1 : c.attn_dropout;
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
      {"attn_pdrop", c.attn_dropout},
      {"layer_norm_epsilon", c.layer_norm_eps},
      {"initializer_range", c.init_std},
      {"bos_token_id", 1},
      {"eos_token_id", 2},
      {"tie_word_embeddings", true},
      {"torch_dtype", "float32"},
  };
}

GptConfig from_hf_config(const nlohmann::json& j, const std::string& path) {
  const HfConfigReader r(j, path, "gpt2", "GPT-2");
  GptConfig c;
  c.n_layer = r.size("n_layer", 1024);
  c.n_head = r.size("n_head", 1024);
  c.n_embd = r.size("n_embd", 1 << 16);
  c.block_size = r.size("n_positions", 1 << 20);
  c.vocab_size = r.size("vocab_size", 1 << 24);
  c.dropout = r.real("resid_pdrop", c.dropout, 0.0, 1.0);
  c.attn_dropout = r.real("attn_pdrop", c.dropout, 0.0, 1.0);
  c.layer_norm_eps = r.real("layer_norm_epsilon", c.layer_norm_eps, 0.0, 1.0, true);
  c.init_std = r.real("initializer_range", c.init_std, 0.0, 1.0, true);
  if (c.n_embd % c.n_head != 0)
    r.fail("n_head = " + std::to_string(c.n_head) + " does not divide n_embd = " + std::to_string(c.n_embd));
  r.fixed("activation_function", {"gelu_new", "gelu_pytorch_tanh"}, "this GPT-2 uses the tanh GELU: gelu_new or gelu_pytorch_tanh");
  r.fixed("tie_word_embeddings", {true}, "the LM head shares the token embedding: true");
  r.fixed("n_inner", {4 * c.n_embd}, "the MLP is 4 x n_embd = " + std::to_string(4 * c.n_embd) + " wide, or null");
  r.fixed("scale_attn_weights", {true}, "scores are scaled by 1/sqrt(head size): true");
  r.fixed("scale_attn_by_inverse_layer_idx", {false}, "false");
  r.fixed("reorder_and_upcast_attn", {false}, "false");
  r.fixed("add_cross_attention", {false}, "a decoder-only model: false");
  if (r.present("n_ctx") && j["n_ctx"] != j["n_positions"])
    r.fail("\"n_ctx\" = " + j["n_ctx"].dump() + " differs from n_positions = " + std::to_string(c.block_size));
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
