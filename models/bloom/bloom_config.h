// BLOOM family configuration (BigScience's multilingual models, 560m to 176b), and its conversion to
// and from Hugging Face's BloomConfig (config.json).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "src/core/recipe.h"

namespace colossal::bloom {

struct BloomConfig {
  int64_t n_layer = 24, n_head = 16, n_embd = 1024;   // n_layer, n_head, hidden_size (n_embed in old files)
  int64_t vocab_size = 250880;
  // ALiBi needs no position table, so nothing in config.json bounds the context; this is the one
  // training and generation use (BLOOM was trained at 2048; "seq_length" when a config names it).
  int64_t max_positions = 2048;
  double dropout = 0.0, attn_dropout = 0.0;           // hidden_dropout, attention_dropout
  double layer_norm_eps = 1e-5;                       // layer_norm_epsilon
  double init_std = 0.02;                             // initializer_range
  int64_t bos_token_id = 1, eos_token_id = 2, pad_token_id = 3;
};

BloomConfig from_recipe(const ModelConfig& m);   // ModelKeyError for a value BLOOM cannot take
ModelConfig to_model_config(const BloomConfig& c);
nlohmann::json to_hf_config(const BloomConfig& c);
BloomConfig from_hf_config(const nlohmann::json& j, const std::string& path);   // Error names path and key
int64_t parameter_count(const BloomConfig& c);   // tied head counted once

}  // namespace colossal::bloom
