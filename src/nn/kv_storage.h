// A KV cache's stored form on ATen's side (kernels/cpu/kv_element.h names the forms): keys and values
// of the compute dtype go into a cache of fp32, fp16, bf16 or int8 rows and come back out for ATen's
// attention. A 16-bit form is a rounding by ATen's conversion; an int8 row is its D values then its fp32
// scale's 4 bytes (the cache's last dimension is D + 4), quantized operation for operation as the CPU
// kernels' store_kv does, so ATen's paths (prefill, a GPU's steps, serving on ATen, a captured step's
// slot write) and the kernels write the same bytes and read back the same values.
#pragma once
#include <ATen/core/Tensor.h>

namespace colossal::nn {

// The cache's last dimension for heads of head_dim in `stored`.
int64_t kv_row_width(int64_t head_dim, at::ScalarType stored);

// x [..., D] (any floating dtype) as `stored` holds it: [..., kv_row_width(D, stored)].
at::Tensor to_kv_storage(const at::Tensor& x, at::ScalarType stored);

// dst (rows of the cache) = x [..., D] as dst's dtype holds it.
void store_kv_rows(const at::Tensor& dst, const at::Tensor& x);

// Cache rows [..., W] of any stored form back as values [..., D] in `computed`.
at::Tensor from_kv_storage(const at::Tensor& rows, at::ScalarType computed);

}  // namespace colossal::nn
