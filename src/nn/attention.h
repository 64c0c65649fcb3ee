// Multi-head self-attention with a fused QKV projection (column-split) and an output projection
// (row-split), on ATen's scaled_dot_product_attention (flash/memory-efficient kernels where the
// device has them). Optionally reads and extends a per-layer KV cache for generation.
#pragma once
#include <ATen/core/Tensor.h>
#include <memory>

#include "src/nn/factory.h"
#include "src/nn/module.h"

namespace colossal::nn {

// Keys and values of one layer for positions [0, length) of each sequence: [B, H, capacity, head_dim].
struct LayerKv {
  at::Tensor k, v;
};

class Attention : public Module {
 public:
  Attention(const AttentionSpec& spec, LayerFactory& factory);

  // x [B, T, C] -> [B, T, C]. With `kv`, keys/values of the T new positions are written at
  // [offset, offset+T) and attention runs over [0, offset+T). `mask` (bool, true = may attend),
  // broadcastable to [B, H, T, offset+T], replaces the causal rule when given.
  at::Tensor forward(const at::Tensor& x, LayerKv* kv = nullptr, int64_t offset = 0, const at::Tensor& mask = {});

  int64_t heads() const { return spec_.heads; }
  int64_t head_dim() const { return spec_.width / spec_.heads; }

 private:
  // ALiBi's path: ATen's attention with the distance bias as its float mask, with or without a cache.
  at::Tensor alibi_forward(const at::Tensor& packed, LayerKv* kv, int64_t offset, const at::Tensor& mask, double p_attn);

  AttentionSpec spec_;
  std::shared_ptr<Linear> qkv_, proj_;
  at::Tensor alibi_slopes_;   // [H] on the CPU, when spec_.alibi
};

}  // namespace colossal::nn
