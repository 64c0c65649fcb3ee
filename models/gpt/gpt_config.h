// GPT-2 family configuration, and its conversion to and from Hugging Face's GPT2Config (config.json).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>

#include "src/core/recipe.h"

namespace colossal::gpt {

struct GptConfig {
  int64_t n_layer = 12, n_head = 12, n_embd = 768;
  int64_t block_size = 1024, vocab_size = 50304;
  double dropout = 0.0;
  bool bias = true;
  double layer_norm_eps = 1e-5;
  double init_std = 0.02;
  double attn_dropout = 0.0;   // attention probabilities (HF's attn_pdrop); the rest drop at `dropout`
};

GptConfig from_recipe(const ModelConfig& m);
nlohmann::json to_hf_config(const GptConfig& c);
GptConfig from_hf_config(const nlohmann::json& j, const std::string& path);   // Error names path and key
ModelConfig to_model_config(const GptConfig& c);

}  // namespace colossal::gpt

namespace colossal::gpt {
// Parameters of the model this config builds (tied head counted once), without building it.
int64_t parameter_count(const GptConfig& c);
}  // namespace colossal::gpt
