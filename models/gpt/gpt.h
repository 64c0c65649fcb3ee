// GPT-2: learned token and position embeddings, pre-LayerNorm blocks of causal self-attention and a
// tanh-GELU MLP, a final LayerNorm and an LM head tied to the token embedding. Built entirely from
// src/nn blocks through the layer factory; parameter names map 1:1 onto Hugging Face GPT-2's.
#pragma once
#include <memory>

#include "models/gpt/gpt_config.h"
#include "src/nn/block.h"
#include "src/nn/causal_lm.h"
#include "src/nn/factory.h"
#include "src/nn/layer_norm.h"

namespace colossal::gpt {

class Gpt : public nn::CausalLM {
 public:
  Gpt(const GptConfig& c, nn::LayerFactory& f);

  at::Tensor features(const at::Tensor& ids, const nn::ForwardOptions& options = {}) override;
  at::Tensor head_weight() override { return wte->weight(); }   // tied LM head
  nn::Embedding* tied_head() override { return wte.get(); }
  std::vector<std::string> embedding_modules() const override { return {"wte", "wpe"}; }
  std::vector<std::string> tied_to_head() const override { return {"wte"}; }
  nn::KvCache make_cache(int64_t batch, int64_t capacity, const c10::Device& device) const override;
  int64_t context_length() const override { return cfg_.block_size; }
  int64_t vocab_size() const override { return cfg_.vocab_size; }
  void init_parameter(const std::string& name, const at::Tensor& value) const override;
  const nn::HfNameMap& hf_names() const override;
  nlohmann::json hf_config() const override { return to_hf_config(cfg_); }
  const GptConfig& config() const { return cfg_; }

  // The stages every model exposes (pipeline and memory managers wrap them); the head is
  // CausalLM's, over features() and head_weight().
  at::Tensor embed(const at::Tensor& ids, const at::Tensor& positions);   // [B, T] -> [B, T, C]

 private:
  GptConfig cfg_;
  std::shared_ptr<const nn::StreamCut> cut_;   // dropout on the layout's piece of the stream
  std::shared_ptr<nn::Embedding> wte, wpe;
  std::shared_ptr<nn::LayerNorm> ln_f;
};

}  // namespace colossal::gpt
