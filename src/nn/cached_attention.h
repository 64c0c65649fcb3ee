// Attention that reads and extends a layer's KV cache (generation). Prefill and masked steps run on
// ATen's scaled_dot_product_attention (a cache narrower than the compute dtype widened for it); a
// one-token step on CPU float tensors, over a cache of float, half, bfloat16 or int8 rows, runs
// kernels/cpu/decode_attention (cache write and attention in one call) when it wins at that shape
// (kernel_choice.h, kernel "attention", shape "decode B H D", or "decode B H D alibi" with BLOOM's
// distance bias, " kv=fp16", " kv=bf16" or " kv=int8" added over such a cache, timed once on the first step).
#pragma once
#include <ATen/core/Tensor.h>
#include <functional>
#include <optional>

#include "kernels/cpu/kv_element.h"
#include "src/nn/attention.h"

namespace colossal::nn {

// What a cache of `dtype` stores, as the kernels name it (float, half, bfloat16 or int8 rows); nullopt for
// any other dtype.
std::optional<kernels::KvElement> kv_element_for(at::ScalarType dtype);
// The same for a CPU cache tensor; nullopt for any other tensor, which the CPU kernels do not take.
std::optional<kernels::KvElement> kv_element_of(const at::Tensor& cache);
// Whether kv's keys and values are contiguous tensors of one dtype and one shape [_, heads, _, W], W
// the row width of head_dim in that dtype (kv_storage.h): what the kernels address as rows.
bool kv_holds_heads(const LayerKv& kv, int64_t heads, int64_t head_dim);

// qkv [B, T, 3C] laid out as [B, T, 3, H, D]: keys and values of the T new positions are written into
// kv at [offset, offset + T), then queries attend over [0, offset + T) -> y [B, T, C] (before the output
// projection). `mask` (bool, true = may attend) broadcastable to [B, H, T, offset + T] replaces the
// causal rule; a multi-token step at offset > 0 needs one. No dropout: generation only.
at::Tensor cached_attention(const at::Tensor& qkv, LayerKv& kv, int64_t offset, int64_t heads, const at::Tensor& mask);

// Keys and values k, v [B, H, T, D] into kv at [offset, offset + T), or at kv.slot (one token, with the
// step's mask) where a captured step set it.
void write_keys_values(LayerKv& kv, int64_t offset, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask);

// The same on ATen alone, and the fused one-token path alone (which needs decode_step_applies).
at::Tensor aten_cached_attention(const at::Tensor& qkv, LayerKv& kv, int64_t offset, int64_t heads,
                                 const at::Tensor& mask);
bool decode_step_applies(const at::Tensor& qkv, const LayerKv& kv, int64_t offset, const at::Tensor& mask);
// The cache's and the mask's part of that: a one-token step of b sequences at `offset`.
bool decode_cache_applies(int64_t b, const LayerKv& kv, int64_t offset, const at::Tensor& mask);
// `alibi_slopes` [heads] (float, CPU) or undefined: ALiBi's slope * (key - query position) on each score.
at::Tensor fused_decode_attention(const at::Tensor& qkv, LayerKv& kv, int64_t offset, int64_t heads,
                                  const at::Tensor& mask, const at::Tensor& alibi_slopes = {});
// A one-token step on the fused path, with ALiBi's slopes [heads] where defined (BLOOM), where
// decode_step_applies and it wins against `aten`, the caller's ATen path (timed once per shape as above,
// with slopes against the ALiBi layer's own path, which builds the bias as a tensor). nullopt where the
// caller's ATen path is to run instead.
std::optional<at::Tensor> chosen_decode_attention(const at::Tensor& qkv, LayerKv& kv, int64_t offset, int64_t heads,
                                                  const at::Tensor& mask, const at::Tensor& alibi_slopes,
                                                  const std::function<void()>& aten);

}  // namespace colossal::nn
