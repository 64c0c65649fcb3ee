// GPT-2 model: see gpt.h.
#include "models/gpt/gpt.h"

#include <ATen/ATen.h>
#include <cmath>

namespace colossal::gpt {

namespace {

nn::BlockSpec block_spec(const GptConfig& c) {
  return {.attn = {.width = c.n_embd, .heads = c.n_head, .causal = true, .bias = c.bias, .dropout = c.dropout, .attn_dropout = c.attn_dropout},
          .mlp = {.width = c.n_embd, .hidden = 4 * c.n_embd, .act = nn::Act::GeluTanh, .bias = c.bias, .dropout = c.dropout},
          .norm_eps = c.layer_norm_eps,
          .pre_norm = true};
}

}  // namespace

Gpt::Gpt(const GptConfig& c, nn::LayerFactory& f) : cfg_(c), cut_(f.stream_cut()) {
  wte = register_module("wte", f.embedding(c.vocab_size, c.n_embd, nn::Split::Vocab));
  wpe = register_module("wpe", f.embedding(c.block_size, c.n_embd));
  blocks_ = nn::add_blocks(*this, block_spec(c), c.n_layer, f);
  ln_f = register_module("ln_f", f.layer_norm(c.n_embd, c.layer_norm_eps));
}

void Gpt::init_parameter(const std::string& name, const at::Tensor& p) const {
  // GPT-2's scheme: N(0, 0.02) for matrices and embeddings, residual projections scaled down by
  // sqrt(2 * n_layer) so the residual stream's variance does not grow with depth.
  // Norms and biases as every family (nn::init_normal).
  const bool residual = name.find(".proj.weight") != std::string::npos;
  nn::init_normal(name, p, residual ? cfg_.init_std / std::sqrt(2.0 * cfg_.n_layer) : cfg_.init_std);
}

at::Tensor Gpt::embed(const at::Tensor& ids, const at::Tensor& positions) {
  auto x = wte->forward(ids) + wpe->forward(positions);   // [B, T, C]
  const double p = is_training() ? cfg_.dropout : 0.0;
  return p > 0 ? cut_->dropout(x, p) : x;
}

at::Tensor Gpt::features(const at::Tensor& ids, const nn::ForwardOptions& o) {
  const at::Tensor positions = nn::positions_of(ids, o, cfg_.block_size);
  auto x = nn::run_blocks(blocks_, [&] { return embed(ids, positions); }, o, block_hooks());   // [B, T, C]
  return ln_f->forward(x);
}

nn::KvCache Gpt::make_cache(int64_t batch, int64_t capacity, const c10::Device& device) const {
  const auto opts = cache_options(device, wte->output_dtype());
  return nn::make_kv_cache(cfg_.n_layer, batch, blocks_.front()->heads(), capacity, cfg_.n_embd / cfg_.n_head, opts);
}

const nn::HfNameMap& Gpt::hf_names() const {
  static const nn::HfNameMap map(
      {
          {"wte", "transformer.wte"},
          {"wpe", "transformer.wpe"},
          {"blocks.*.ln_1", "transformer.h.*.ln_1"},
          {"blocks.*.ln_2", "transformer.h.*.ln_2"},
          {"blocks.*.attn.qkv", "transformer.h.*.attn.c_attn", true},
          {"blocks.*.attn.proj", "transformer.h.*.attn.c_proj", true},
          {"blocks.*.mlp.fc", "transformer.h.*.mlp.c_fc", true},
          {"blocks.*.mlp.proj", "transformer.h.*.mlp.c_proj", true},
          {"ln_f", "transformer.ln_f"},
      },
      {"lm_head.weight", "transformer.h.*.attn.bias", "transformer.h.*.attn.masked_bias"});
  return map;
}

}  // namespace colossal::gpt
