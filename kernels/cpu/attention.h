// Causal self-attention for short sequences on CPU, forward and backward, straight from the packed
// QKV projection. ATen's CPU flash attention splits keys in blocks of 512, so below that length it
// computes the whole T x T square and masks half of it away; here each tile of queries touches only
// the keys its last row sees, every head's K and V (transposed) stay in L1/L2, and the per-row softmax
// statistics are kept for the backward (FlashAttention-2's recomputation, without blocking: the
// whole row fits). One task per (batch, head), split across OpenMP threads.
//
// Layouts (row-major float):
//   qkv  [B, T, 3, H, D]  (the QKV linear's output, q | k | v along the last 3C features)
//   out  [B, T, H, D]     (so out viewed as [B, T, C] is the input of the output projection)
//   lse  [B, H, T]        (log-sum-exp of each query's scaled scores)
#pragma once
#include <cstdint>

namespace colossal::kernels {

struct AttentionDims {
  int64_t batch, seq, heads, head_dim;
  float scale;   // usually 1/sqrt(head_dim)
};

void causal_attention_forward(const float* qkv, float* out, float* lse, const AttentionDims& dims);

// d_out [B, T, H, D] -> d_qkv [B, T, 3, H, D] (written, not accumulated).
void causal_attention_backward(const float* qkv, const float* out, const float* lse, const float* d_out, float* d_qkv,
                               const AttentionDims& dims);

}  // namespace colossal::kernels
