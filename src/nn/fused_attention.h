// Causal self-attention from the packed QKV projection as one autograd function, for CPU float
// tensors and short sequences (kernels/cpu/attention): no causal half computed and masked away, no
// q/k/v select gradients, and the output already in the [B, T, C] layout the projection reads.
#pragma once
#include <ATen/core/Tensor.h>

namespace colossal::nn {

// Longest sequence the fused kernel takes: its per-head scratch (T x head_dim, four times) stays in
// L2; above this ATen's blocked flash attention is the better choice.
inline constexpr int64_t kFusedAttentionMaxSeq = 256;

bool fused_attention_applies(const at::Tensor& qkv);   // CPU, float, [B, T, 3C] with T <= the maximum
// qkv [B, T, 3C] laid out as [B, T, 3, H, D] -> y [B, T, C]; no dropout, no mask, no cache.
at::Tensor fused_causal_attention(const at::Tensor& qkv, int64_t heads);
// The same operation on ATen's scaled_dot_product_attention (what runs when the fused kernel does not).
at::Tensor aten_causal_attention(const at::Tensor& qkv, int64_t heads);
// Whether the fused kernel runs at this shape: forced by the kernel policy, or the faster of the two
// timed once on this call's input, forward and (when autograd records) backward (kernel_choice.h).
bool fused_attention_chosen(const at::Tensor& qkv, int64_t heads);

}  // namespace colossal::nn
