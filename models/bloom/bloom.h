// BLOOM: a token embedding followed by a LayerNorm (BLOOM's addition for training stability), pre-LN
// blocks whose attention adds ALiBi's distance bias instead of using position embeddings, a tanh-GELU
// MLP, a final LayerNorm and an LM head tied to the embedding. Built from src/nn blocks; HF's fused
// query_key_value interleaves q, k and v per head, which the name map converts.
#pragma once
#include <memory>

#include "models/bloom/bloom_config.h"
#include "src/nn/block.h"
#include "src/nn/causal_lm.h"
#include "src/nn/factory.h"
#include "src/nn/layer_norm.h"

namespace colossal::bloom {

class Bloom : public nn::CausalLM {
 public:
  Bloom(const BloomConfig& c, nn::LayerFactory& f);

  at::Tensor features(const at::Tensor& ids, const nn::ForwardOptions& options = {}) override;   // [B, T, C]
  at::Tensor head_weight() override { return wte->weight(); }   // tied LM head
  nn::Embedding* tied_head() override { return wte.get(); }
  std::vector<std::string> embedding_modules() const override { return {"wte", "ln_emb"}; }
  std::vector<std::string> tied_to_head() const override { return {"wte"}; }
  nn::KvCache make_cache(int64_t batch, int64_t capacity, const c10::Device& device) const override;
  int64_t context_length() const override { return cfg_.max_positions; }
  int64_t vocab_size() const override { return cfg_.vocab_size; }
  void init_parameter(const std::string& name, const at::Tensor& value) const override;
  const nn::HfNameMap& hf_names() const override { return names_; }
  nlohmann::json hf_config() const override { return to_hf_config(cfg_); }
  const BloomConfig& config() const { return cfg_; }

 private:
  BloomConfig cfg_;
  nn::HfNameMap names_;   // depends on the head count (the qkv interleave)
  std::shared_ptr<nn::Embedding> wte;
  std::shared_ptr<nn::LayerNorm> ln_emb, ln_f;
};

}  // namespace colossal::bloom
