// ViT configuration conversions: see vit_config.h.
#include "models/vit/vit_config.h"

#include "models/hf_activation.h"
#include "src/core/error.h"
#include "src/core/text.h"
#include "src/io/hf_config.h"

namespace colossal::vit {
namespace {

// The side must be a whole number of patches: transformers would drop the remainder silently.
std::string patch_problem(int64_t image, int64_t patch) {
  if (image % patch == 0) return "";
  return "does not divide image_size = " + std::to_string(image) + " into whole patches";
}

}  // namespace

VitConfig from_recipe(const ModelConfig& m) {
  VitConfig c;
  c.n_layer = m.n_layer, c.n_head = m.n_head, c.n_embd = m.n_embd;
  c.intermediate = m.n_inner ? m.n_inner : 4 * m.n_embd;
  c.image_size = m.image_size, c.patch_size = m.patch_size, c.channels = m.channels;
  c.num_labels = m.num_labels;
  c.dropout = m.dropout;
  c.attn_dropout = m.attention_dropout();
  c.layer_norm_eps = m.layer_norm_eps, c.init_std = m.init_std;
  c.activation = hf_activation_of_recipe(m.activation, c.activation);
  if (auto why = patch_problem(c.image_size, c.patch_size); !why.empty())
    throw ModelKeyError("patch_size", "= " + std::to_string(c.patch_size) + " " + why);
  if (!m.bias) throw ModelKeyError("bias", "= false: ViT's linear layers have biases (valid: true)");
  // pre_norm is not read: ViT normalises before each sublayer whatever the key says.
  return c;
}

ModelConfig to_model_config(const VitConfig& c) {
  ModelConfig m;
  m.family = "vit";
  m.n_layer = c.n_layer, m.n_head = c.n_head, m.n_embd = c.n_embd;
  m.n_inner = c.intermediate;
  m.image_size = c.image_size, m.patch_size = c.patch_size, m.channels = c.channels;
  m.num_labels = c.num_labels;
  m.block_size = c.patches() + 1;   // the sequence the blocks see
  m.vocab_size = 8;                 // no vocabulary; the smallest [model] accepts
  m.dropout = c.dropout, m.attn_dropout = c.attn_dropout;
  m.layer_norm_eps = c.layer_norm_eps, m.init_std = c.init_std;
  m.head = "classifier";
  m.activation = recipe_activation_of_hf(c.activation);
  return m;
}

nn::Act activation_of(const VitConfig& c) { return activation_of_hf(c.activation, "ViT"); }

nlohmann::json to_hf_config(const VitConfig& c) {
  nlohmann::json j = {
      {"architectures", {"ViTForImageClassification"}},
      {"model_type", "vit"},
      {"hidden_size", c.n_embd},
      {"num_hidden_layers", c.n_layer},
      {"num_attention_heads", c.n_head},
      {"intermediate_size", c.intermediate},
      {"image_size", c.image_size},
      {"patch_size", c.patch_size},
      {"num_channels", c.channels},
      {"hidden_act", c.activation},
      {"hidden_dropout_prob", c.dropout},
      {"attention_probs_dropout_prob", c.attn_dropout},
      {"layer_norm_eps", c.layer_norm_eps},
      {"initializer_range", c.init_std},
      {"qkv_bias", true},
      {"torch_dtype", "float32"},
  };
  write_labels(j, c.id2label, c.num_labels);
  return j;
}

VitConfig from_hf_config(const nlohmann::json& j, const std::string& path) {
  const HfConfigReader r(j, path, "vit", "ViT");
  VitConfig c;
  c.n_layer = r.size("num_hidden_layers", c.n_layer, 1024);
  c.n_head = r.size("num_attention_heads", c.n_head, 1024);
  c.n_embd = r.size("hidden_size", c.n_embd, 1 << 17);
  c.intermediate = r.size("intermediate_size", c.intermediate, 1 << 20);
  c.image_size = r.size("image_size", c.image_size, 1 << 14);
  c.patch_size = r.size("patch_size", c.patch_size, 1 << 14);
  c.channels = r.size("num_channels", c.channels, 64);
  c.dropout = r.real("hidden_dropout_prob", c.dropout, 0.0, 1.0);
  c.attn_dropout = r.real("attention_probs_dropout_prob", c.attn_dropout, 0.0, 1.0);
  c.layer_norm_eps = r.real("layer_norm_eps", c.layer_norm_eps, 0.0, 1.0, true);
  c.init_std = r.real("initializer_range", c.init_std, 0.0, 1.0, true);
  c.activation = r.choice("hidden_act", "gelu", hf_activation_names());
  if (c.n_embd % c.n_head != 0)
    r.fail("num_attention_heads = " + std::to_string(c.n_head) + " does not divide hidden_size = " + std::to_string(c.n_embd));
  if (auto why = patch_problem(c.image_size, c.patch_size); !why.empty()) r.fail("patch_size = " + std::to_string(c.patch_size) + " " + why);
  r.fixed("qkv_bias", {true}, "query, key and value with biases: true");
  (void)r.first_choice("architectures", "ViTForImageClassification", {"ViTForImageClassification"});
  c.id2label = r.id2label();
  c.num_labels = c.id2label.is_null() ? r.size("num_labels", 2, 1 << 20) : static_cast<int64_t>(c.id2label.size());
  return c;
}

int64_t parameter_count(const VitConfig& c) {
  const int64_t e = c.n_embd, f = c.intermediate;
  const int64_t embeddings = e * c.channels * c.patch_size * c.patch_size + e + e + (c.patches() + 1) * e;
  // Per block: q/k/v/out (4C^2 + 4C), 2 LayerNorms (4C), intermediate and output (2CF + F + C).
  const int64_t block = 4 * e * e + 8 * e + 2 * e * f + f + e;
  return embeddings + c.n_layer * block + 2 * e + e * c.num_labels + c.num_labels;
}

}  // namespace colossal::vit
