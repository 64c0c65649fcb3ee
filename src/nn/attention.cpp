// Self-attention: see attention.h.
#include "src/nn/attention.h"

#include <ATen/ATen.h>

#include "src/nn/cached_attention.h"
#include "src/nn/fused_attention.h"

namespace colossal::nn {

Attention::Attention(const AttentionSpec& spec, LayerFactory& factory) : spec_(spec) {
  qkv_ = register_module("qkv", factory.linear({.in = spec.width, .out = 3 * spec.width, .bias = spec.bias, .split = Split::Column}));
  proj_ = register_module("proj", factory.linear({.in = spec.width, .out = spec.width, .bias = spec.bias, .split = Split::Row}));
}

at::Tensor Attention::forward(const at::Tensor& x, LayerKv* kv, int64_t offset, const at::Tensor& mask) {
  const int64_t b = x.size(0), t = x.size(1), c = x.size(2), h = spec_.heads, d = c / h;
  const double p = is_training() ? spec_.dropout : 0.0;
  const double p_attn = is_training() ? (spec_.attn_dropout < 0 ? spec_.dropout : spec_.attn_dropout) : 0.0;
  auto packed = qkv_->forward(x);                                                 // [B, T, 3C]
  if (!kv && !mask.defined() && spec_.causal && p == 0 && p_attn == 0 && fused_attention_applies(packed) &&
      fused_attention_chosen(packed, h))
    return proj_->forward(fused_causal_attention(packed, h));   // short causal sequences on CPU
  if (kv) {
    TORCH_CHECK(spec_.causal && p == 0 && p_attn == 0, "attention: a KV cache is for causal generation without dropout");
    return proj_->forward(cached_attention(packed, *kv, offset, h, mask));
  }
  auto qkv = packed.view({b, t, 3, h, d}).permute({2, 0, 3, 1, 4});              // [3, B, H, T, D]
  std::optional<at::Tensor> attn_mask;   // an undefined tensor inside an optional still counts as a mask
  if (mask.defined()) attn_mask = mask;
  auto y = at::scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], attn_mask, p_attn, spec_.causal && !mask.defined());
  y = y.transpose(1, 2).reshape({b, t, c});                                 // [B, T, C]
  y = proj_->forward(y);
  return p > 0 ? at::dropout(y, p, true) : y;
}

}  // namespace colossal::nn
