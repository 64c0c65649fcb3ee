// Attention over a KV cache: see cached_attention.h.
#include "src/nn/cached_attention.h"

#include <ATen/ATen.h>
#include <cmath>

#include "kernels/cpu/decode_attention.h"
#include "src/nn/cuda_decode_attention.h"
#include "src/nn/kernel_choice.h"
#include "src/nn/kv_storage.h"

namespace colossal::nn {

std::optional<kernels::KvElement> kv_element_for(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: return kernels::KvElement::f32;
    case at::kHalf: return kernels::KvElement::fp16;
    case at::kBFloat16: return kernels::KvElement::bf16;
    case at::kChar: return kernels::KvElement::int8;
    default: return std::nullopt;
  }
}

std::optional<kernels::KvElement> kv_element_of(const at::Tensor& cache) {
  if (!cache.defined() || !cache.is_cpu()) return std::nullopt;
  return kv_element_for(cache.scalar_type());
}

bool kv_holds_heads(const LayerKv& kv, int64_t heads, int64_t head_dim) {
  return kv.k.defined() && kv.v.scalar_type() == kv.k.scalar_type() && kv.k.is_contiguous() && kv.v.is_contiguous() &&
         kv.v.sizes() == kv.k.sizes() && kv.k.dim() == 4 && kv.k.size(1) == heads && kv.k.size(3) == kv_row_width(head_dim, kv.k.scalar_type());
}

void write_keys_values(LayerKv& kv, int64_t offset, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask) {
  if (!kv.slot.defined()) {
    store_kv_rows(kv.k.narrow(2, offset, k.size(2)), k);
    store_kv_rows(kv.v.narrow(2, offset, v.size(2)), v);
    return;
  }
  // A captured step: the position is on the device, and only its mask tells the window's live keys.
  TORCH_CHECK(k.size(2) == 1 && mask.defined() && offset < kv.k.size(2), "attention: a step at a device-side slot takes one token ",
              "and a mask (got ", k.size(2), " tokens, window ", offset + 1, " of ", kv.k.size(2), ")");
  kv.k.index_copy_(2, kv.slot, to_kv_storage(k, kv.k.scalar_type()));   // index_copy_ takes only the cache's own dtype
  kv.v.index_copy_(2, kv.slot, to_kv_storage(v, kv.v.scalar_type()));
}

at::Tensor aten_cached_attention(const at::Tensor& qkv, LayerKv& kv, int64_t offset, int64_t heads,
                                 const at::Tensor& mask) {
  const int64_t b = qkv.size(0), t = qkv.size(1), c = qkv.size(2) / 3, d = c / heads;
  auto parts = qkv.view({b, t, 3, heads, d}).permute({2, 0, 3, 1, 4});   // [3, B, H, T, D]
  write_keys_values(kv, offset, parts[1], parts[2], mask);
  // A cache narrower than the compute dtype (kv_element.h) is widened for SDPA, which takes one dtype.
  auto k = from_kv_storage(kv.k.narrow(2, 0, offset + t), qkv.scalar_type());
  auto v = from_kv_storage(kv.v.narrow(2, 0, offset + t), qkv.scalar_type());
  // One new query attends to every cached key; a multi-token prefill at offset 0 is plain causal.
  bool causal = !mask.defined() && t > 1;
  TORCH_CHECK(mask.defined() || offset == 0 || t == 1, "attention: multi-token step at offset ", offset,
              " needs an explicit mask");
  std::optional<at::Tensor> attn_mask;   // an undefined tensor inside an optional still counts as a mask
  if (mask.defined()) attn_mask = mask;
  auto y = at::scaled_dot_product_attention(parts[0], k, v, attn_mask, 0.0, causal);   // [B, H, T, D]
  return y.transpose(1, 2).reshape({b, t, c});                                        // [B, T, C]
}

bool decode_cache_applies(int64_t b, const LayerKv& kv, int64_t offset, const at::Tensor& mask) {
  const bool mask_ok = !mask.defined() || (mask.scalar_type() == at::kBool && mask.dim() == 4 && mask.size(0) == b &&
                                           mask.size(1) == 1 && mask.size(2) == 1 && mask.size(3) == offset + 1 &&
                                           mask.is_cpu() && mask.is_contiguous());
  return mask_ok && !kv.slot.defined() && kv_element_of(kv.k) && kv.v.scalar_type() == kv.k.scalar_type() && kv.k.is_contiguous() &&
         kv.v.is_contiguous() && kv.v.sizes() == kv.k.sizes() && kv.k.dim() == 4 && kv.k.size(0) == b && offset < kv.k.size(2);
}

bool decode_step_applies(const at::Tensor& qkv, const LayerKv& kv, int64_t offset, const at::Tensor& mask) {
  return qkv.is_cpu() && qkv.scalar_type() == at::kFloat && qkv.dim() == 3 && qkv.size(1) == 1 &&
         decode_cache_applies(qkv.size(0), kv, offset, mask);
}

namespace {

// The kernel choice's shape of a one-token step.
// The cache's element is part of it: a narrower cache cuts the kernel's reads, and ATen's side widens it.
std::string decode_shape(int64_t b, int64_t heads, int64_t d, bool alibi, kernels::KvElement element) {
  static constexpr const char* kNames[] = {"", " kv=fp16", " kv=bf16", " kv=int8"};   // in KvElement's order
  const char* kv = kNames[static_cast<int>(element)];
  return "decode B=" + std::to_string(b) + " H=" + std::to_string(heads) + " D=" + std::to_string(d) + (alibi ? " alibi" : "") + kv;
}

// The fused step on inputs decode_step_applies has accepted.
at::Tensor decode_step(const at::Tensor& qkv_in, LayerKv& kv, int64_t offset, int64_t heads, const at::Tensor& mask,
                       const at::Tensor& alibi_slopes = {}) {
  const auto qkv = qkv_in.contiguous();
  const int64_t b = qkv.size(0), c = qkv.size(2) / 3, d = c / heads;
  TORCH_CHECK(kv_holds_heads(kv, heads, d), "fused_decode_attention: cache ", kv.k.sizes(),
              " does not hold ", heads, " heads of ", d);
  TORCH_CHECK(!alibi_slopes.defined() || (alibi_slopes.is_cpu() && alibi_slopes.scalar_type() == at::kFloat &&
                                           alibi_slopes.is_contiguous() && alibi_slopes.numel() == heads),
              "fused_decode_attention: ALiBi slopes ", alibi_slopes.sizes(), " for ", heads, " heads (float, CPU)");
  auto y = at::empty({b, 1, c}, qkv.options());
  const kernels::DecodeAttentionDims dims{b, heads, d, kv.k.size(2), offset + 1,
                                         static_cast<float>(1.0 / std::sqrt(static_cast<double>(d))),
                                         alibi_slopes.defined() ? alibi_slopes.const_data_ptr<float>() : nullptr,
                                         *kv_element_of(kv.k)};
  const auto* valid = mask.defined() ? reinterpret_cast<const uint8_t*>(mask.const_data_ptr<bool>()) : nullptr;
  kernels::decode_attention(qkv.const_data_ptr<float>(), kv.k.mutable_data_ptr(), kv.v.mutable_data_ptr(),
                            valid, offset + 1, y.mutable_data_ptr<float>(), dims);
  return y;
}

}  // namespace

at::Tensor fused_decode_attention(const at::Tensor& qkv, LayerKv& kv, int64_t offset, int64_t heads,
                                  const at::Tensor& mask, const at::Tensor& alibi_slopes) {
  TORCH_CHECK(decode_step_applies(qkv, kv, offset, mask), "fused_decode_attention: unsupported inputs, qkv ",
              qkv.sizes(), " cache ", kv.k.sizes(), " offset ", offset);
  return decode_step(qkv, kv, offset, heads, mask, alibi_slopes);
}

std::optional<at::Tensor> chosen_decode_attention(const at::Tensor& qkv, LayerKv& kv, int64_t offset, int64_t heads,
                                                  const at::Tensor& mask, const at::Tensor& alibi_slopes,
                                                  const std::function<void()>& aten) {
  if (!decode_step_applies(qkv, kv, offset, mask)) return std::nullopt;
  // Both sides write the same key and value at `offset`, so timing them on the real cache is harmless.
  if (!use_ours("attention", kernel_policy().attention,
                decode_shape(qkv.size(0), heads, qkv.size(2) / 3 / heads, alibi_slopes.defined(), *kv_element_of(kv.k)),
                [&] { decode_step(qkv, kv, offset, heads, mask, alibi_slopes); }, aten))
    return std::nullopt;
  return decode_step(qkv, kv, offset, heads, mask, alibi_slopes);
}

at::Tensor cached_attention(const at::Tensor& qkv, LayerKv& kv, int64_t offset, int64_t heads, const at::Tensor& mask) {
  if (auto y = chosen_decode_attention(qkv, kv, offset, heads, mask, {}, [&] { aten_cached_attention(qkv, kv, offset, heads, mask); }))
    return *y;
  if (auto y = cuda_decode_attention(qkv, kv, offset, heads, mask)) return *y;   // a GPU's step over a narrow cache
  return aten_cached_attention(qkv, kv, offset, heads, mask);
}

}  // namespace colossal::nn
