// A decoding step's attention on a GPU over a narrow KV cache: see cuda_decode_attention.h.
#include "src/nn/cuda_decode_attention.h"

#include "kernels/cuda/built.h"
#include "src/nn/cached_attention.h"
#include "src/nn/kernel_choice.h"

#if COLOSSAL_CUDA_KERNELS
#include <ATen/ATen.h>
#include <cmath>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "kernels/cuda/decode_attention.h"
#endif

namespace colossal::nn {

#if COLOSSAL_CUDA_KERNELS

std::optional<at::Tensor> cuda_decode_attention(const at::Tensor& qkv, LayerKv& kv, int64_t offset, int64_t heads,
                                                const at::Tensor& mask, const at::Tensor& alibi_slopes) {
  if (kernel_policy().attention == KernelPath::Aten || !qkv.is_cuda() || qkv.scalar_type() != at::kFloat || qkv.dim() != 3 ||
      qkv.size(1) != 1 || !kv.k.defined() || kv.paged)
    return std::nullopt;
  const auto element = kv_element_for(kv.k.scalar_type());
  const int64_t b = qkv.size(0), c = qkv.size(2) / 3, d = c / heads, n = offset + 1;
  const auto on_device = [&](const at::Tensor& t) { return t.device() == qkv.device() && t.is_contiguous(); };
  if (!element || *element == kernels::KvElement::f32 || !kv_holds_heads(kv, heads, d) || !on_device(kv.k) || !on_device(kv.v) ||
      kv.k.size(0) != b || n > kv.k.size(2) || n > kernels::kCudaDecodeAttentionMaxLength)
    return std::nullopt;
  if (mask.defined() && !(mask.scalar_type() == at::kBool && on_device(mask) && mask.dim() == 4 && mask.size(0) == b &&
                          mask.size(1) == 1 && mask.size(2) == 1 && mask.size(3) == n))
    return std::nullopt;
  if (alibi_slopes.defined() && !(alibi_slopes.scalar_type() == at::kFloat && on_device(alibi_slopes) && alibi_slopes.numel() == heads))
    return std::nullopt;
  if (kv.slot.defined() && !mask.defined()) return std::nullopt;   // a captured step's live keys come from its mask

  const c10::cuda::CUDAGuard guard(qkv.device());
  const at::Tensor packed = qkv.contiguous();
  const auto parts = packed.view({b, 1, 3, heads, d}).permute({2, 0, 3, 1, 4});   // [3, B, H, 1, D]
  write_keys_values(kv, offset, parts[1], parts[2], mask);
  at::Tensor y = at::empty({b, 1, c}, packed.options());
  kernels::CudaDecodeAttention a;
  a.q = packed.const_data_ptr<float>();
  a.q_batch_stride = 3 * c;
  a.k = kv.k.const_data_ptr();
  a.v = kv.v.const_data_ptr();
  a.element = *element;
  a.batch = b, a.heads = heads, a.head_dim = d, a.capacity = kv.k.size(2), a.length = n;
  if (mask.defined()) a.valid = mask.const_data_ptr<bool>(), a.valid_stride = n;
  if (alibi_slopes.defined()) a.alibi_slopes = alibi_slopes.const_data_ptr<float>();
  if (kv.slot.defined()) a.query_position = kv.slot.const_data_ptr<int64_t>();
  a.query_position_host = offset;
  a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  a.out = y.mutable_data_ptr<float>();
  kernels::decode_attention_cuda(a, c10::cuda::getCurrentCUDAStream(qkv.get_device()).stream());
  return y;
}

#else

std::optional<at::Tensor> cuda_decode_attention(const at::Tensor&, LayerKv&, int64_t, int64_t, const at::Tensor&, const at::Tensor&) {
  return std::nullopt;   // no CUDA kernels in this build: ATen's path
}

#endif

}  // namespace colossal::nn
