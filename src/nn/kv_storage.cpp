// A KV cache's stored form on ATen's side: see kv_storage.h.
#include "src/nn/kv_storage.h"

#include <ATen/ATen.h>

#include "kernels/cpu/kv_element.h"

namespace colossal::nn {

using kernels::kKvInt8Max;
using kernels::kKvScaleBytes;

int64_t kv_row_width(int64_t head_dim, at::ScalarType stored) {
  return stored == at::kChar ? head_dim + kKvScaleBytes : head_dim;
}

at::Tensor to_kv_storage(const at::Tensor& x, at::ScalarType stored) {
  if (stored != at::kChar) return x.to(stored);
  // kv_element.h's rule, each step one IEEE operation as in store_kv: true divisions by a tensor (a
  // scalar divisor may become a multiplication by its reciprocal), round() to nearest-even.
  const at::Tensor xf = x.to(at::kFloat);
  const at::Tensor amax = xf.abs().amax(-1, /*keepdim=*/true);
  const at::Tensor limit = at::full_like(amax, kKvInt8Max);
  const at::Tensor inv = at::where(amax >= kernels::kKvInt8Smallest, limit / amax, at::zeros_like(amax));
  const at::Tensor q = (xf * inv).round().clamp(-kKvInt8Max, kKvInt8Max).to(at::kChar);
  const at::Tensor scale = (amax / limit).contiguous().view(at::kChar);   // [..., 1] float as [..., 4] bytes
  return at::cat({q, scale}, -1);
}

void store_kv_rows(const at::Tensor& dst, const at::Tensor& x) {
  if (dst.scalar_type() == at::kChar) dst.copy_(to_kv_storage(x, at::kChar));
  else dst.copy_(x);   // copy_ rounds to a narrower float as .to does
}

at::Tensor from_kv_storage(const at::Tensor& rows, at::ScalarType computed) {
  if (rows.scalar_type() != at::kChar) return rows.to(computed);
  const int64_t d = rows.size(-1) - kKvScaleBytes;
  // clone: a contiguous view may start off a float's alignment in its storage, which view(kFloat) refuses
  const at::Tensor scale = rows.narrow(-1, d, kKvScaleBytes).clone(at::MemoryFormat::Contiguous).view(at::kFloat);   // [..., 1]
  return (rows.narrow(-1, 0, d).to(at::kFloat) * scale).to(computed);   // float(q) * scale: one rounding, as the kernels read
}

}  // namespace colossal::nn
