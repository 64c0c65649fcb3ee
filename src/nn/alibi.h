// ALiBi (Press et al., 2022), BLOOM's positions: no position embedding; each head h adds
// slope_h * (key position - query position) to its attention scores, a linear penalty on distance.
// The slopes form a geometric sequence per head count (see alibi_slopes); the bias goes to ATen's
// scaled_dot_product_attention as its float mask, with -inf where a key may not be attended.
#pragma once
#include <ATen/core/Tensor.h>

namespace colossal::nn {

// Slopes of `heads` heads, float [H]: for the largest power of two n <= heads, 2^(-8/n * i) for
// i = 1..n; the heads beyond n take the odd-numbered slopes of the sequence for 2n (BLOOM's rule).
at::Tensor alibi_slopes(int64_t heads);

// The additive mask for T queries at positions offset..offset+T-1 over S keys at 0..S-1:
// float [1 or B, H, T, S]. `allowed` (bool, broadcastable to [B, H, T, S], true = may attend) replaces
// the causal rule when defined; otherwise keys after the query are masked if `causal`.
at::Tensor alibi_bias(const at::Tensor& slopes, int64_t t, int64_t offset, int64_t s, const at::Tensor& allowed, bool causal);
// The same for queries at `query_positions` [T] (on the slopes' device): a captured decoding step's
// query sits at a position the device holds (LayerKv::slot), the same integer distances from there.
at::Tensor alibi_bias(const at::Tensor& slopes, const at::Tensor& query_positions, int64_t s, const at::Tensor& allowed, bool causal);
// The same for queries and keys at any positions (a sequence-parallel rank's chunks): float [H, Tq, Tk]
// from int64 positions [Tq] and [Tk], -inf where a key comes after its query when `causal`.
at::Tensor alibi_bias_at(const at::Tensor& slopes, const at::Tensor& query_positions, const at::Tensor& key_positions, bool causal);

}  // namespace colossal::nn
