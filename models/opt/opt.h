// OPT: a token embedding (optionally narrower than the model, projected in and out), learned
// positions read from row 2 on, blocks of causal self-attention and a ReLU MLP (pre-LN, or post-LN as
// in opt-350m), a final LayerNorm for pre-LN models, and an LM head tied to the token embedding.
// Built from src/nn blocks; HF keeps q/k/v as three tensors, which the name map joins into our qkv.
#pragma once
#include <memory>

#include "models/opt/opt_config.h"
#include "src/nn/block.h"
#include "src/nn/causal_lm.h"
#include "src/nn/factory.h"
#include "src/nn/layer_norm.h"

namespace colossal::opt {

class Opt : public nn::CausalLM {
 public:
  Opt(const OptConfig& c, nn::LayerFactory& f);

  at::Tensor features(const at::Tensor& ids, const nn::ForwardOptions& options = {}) override;   // [B, T, embed_dim]
  at::Tensor head_weight() override { return embed_tokens->weight(); }   // tied LM head
  nn::Embedding* tied_head() override { return embed_tokens.get(); }
  std::vector<std::string> embedding_modules() const override { return {"embed_tokens", "embed_positions", "project_in"}; }
  std::vector<std::string> tied_to_head() const override { return {"embed_tokens"}; }
  nn::KvCache make_cache(int64_t batch, int64_t capacity, const c10::Device& device) const override;
  int64_t context_length() const override { return cfg_.max_positions; }
  int64_t vocab_size() const override { return cfg_.vocab_size; }
  void init_parameter(const std::string& name, const at::Tensor& value) const override;
  const nn::HfNameMap& hf_names() const override;
  nlohmann::json hf_config() const override { return to_hf_config(cfg_); }
  const OptConfig& config() const { return cfg_; }

  at::Tensor embed(const at::Tensor& ids, const at::Tensor& positions);   // [B, T] -> [B, T, C]

 private:
  OptConfig cfg_;
  std::shared_ptr<nn::Embedding> embed_tokens, embed_positions;
  std::shared_ptr<nn::Linear> project_in, project_out;   // null when embed_dim == n_embd
  std::shared_ptr<nn::LayerNorm> ln_f;                   // null for post-LN models
};

}  // namespace colossal::opt
