// OPT family configuration (Meta's Open Pre-trained Transformers, 125m to 175b), and its conversion to
// and from Hugging Face's OPTConfig (config.json).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "src/core/recipe.h"
#include "src/nn/factory.h"

namespace colossal::opt {

struct OptConfig {
  int64_t n_layer = 12, n_head = 12, n_embd = 768;   // num_hidden_layers, num_attention_heads, hidden_size
  int64_t ffn_dim = 3072;
  int64_t max_positions = 2048;                      // max_position_embeddings (the table has 2 more rows)
  int64_t vocab_size = 50272;
  int64_t embed_dim = 768;                           // word_embed_proj_dim: != n_embd adds project_in/out
  bool pre_norm = true;                              // do_layer_norm_before (false only for opt-350m)
  double dropout = 0.1, attn_dropout = 0.0;
  bool bias = true;                                  // enable_bias
  double init_std = 0.02;
  std::string activation = "relu";                   // HF's activation_function name
  int64_t bos_token_id = 2, eos_token_id = 2, pad_token_id = 1;
};

// Positions index the learned table from row 2 (fairseq reserved rows 0 and 1 for padding).
inline constexpr int64_t kPositionOffset = 2;

OptConfig from_recipe(const ModelConfig& m);   // ModelKeyError for a value OPT cannot take
ModelConfig to_model_config(const OptConfig& c);
nlohmann::json to_hf_config(const OptConfig& c);
OptConfig from_hf_config(const nlohmann::json& j, const std::string& path);   // Error names path and key
nn::Act activation_of(const OptConfig& c);
int64_t parameter_count(const OptConfig& c);   // tied head counted once

}  // namespace colossal::opt
