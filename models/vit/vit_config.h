// ViT family configuration (Dosovitskiy et al.'s Vision Transformer, vit-tiny to vit-huge), and its
// conversion to and from Hugging Face's ViTConfig for ViTForImageClassification (config.json).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "src/core/recipe.h"
#include "src/nn/factory.h"

namespace colossal::vit {

struct VitConfig {
  int64_t n_layer = 12, n_head = 12, n_embd = 768;   // num_hidden_layers, num_attention_heads, hidden_size
  int64_t intermediate = 3072;                       // intermediate_size
  int64_t image_size = 224, patch_size = 16, channels = 3;   // num_channels
  int64_t num_labels = 1000;
  double dropout = 0.0, attn_dropout = 0.0;          // hidden_dropout_prob, attention_probs_dropout_prob
  double layer_norm_eps = 1e-12;
  double init_std = 0.02;                            // initializer_range
  std::string activation = "gelu";                   // hidden_act (exact GELU)
  nlohmann::json id2label;                           // kept as the source config wrote it (null: generated)

  int64_t patches() const { return (image_size / patch_size) * (image_size / patch_size); }
};

VitConfig from_recipe(const ModelConfig& m);   // ModelKeyError for a value ViT cannot take
ModelConfig to_model_config(const VitConfig& c);
nlohmann::json to_hf_config(const VitConfig& c);
VitConfig from_hf_config(const nlohmann::json& j, const std::string& path);   // Error names path and key
nn::Act activation_of(const VitConfig& c);
int64_t parameter_count(const VitConfig& c);

}  // namespace colossal::vit
