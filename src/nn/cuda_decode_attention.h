// A decoding step's attention on a GPU over a narrow KV cache (fp16, bf16 or int8 rows), through
// kernels/cuda/decode_attention.h: the new key and value are written as ATen's path writes them
// (write_keys_values), then one kernel reads the cache as stored. ATen's path would read the whole window
// back into a new copy of the compute dtype every step for scaled_dot_product_attention, which for these
// caches costs more than their narrower reads save. An fp32 cache keeps ATen's path (SDPA reads it in
// place) until the kernel is measured against it on a GPU. Eager steps and captured ones (a device-side
// slot, the window's mask) alike; `--kernels aten` turns it off.
#pragma once
#include <ATen/core/Tensor.h>
#include <optional>

#include "src/nn/attention.h"

namespace colossal::nn {

// qkv [B, 1, 3C] on a CUDA device, fp32: the step's attention output [B, 1, C] (before the output
// projection), keys and values written; nullopt where it does not apply (another device or dtype, an
// fp32 cache, a window longer than the kernel takes, a mask other than [B, 1, 1, offset + 1] bool, no
// CUDA kernels in this build) and the caller's ATen path is to run. `alibi_slopes` [heads] (float, on
// the device) or undefined: the query sits at kv.slot where defined, else at `offset`.
std::optional<at::Tensor> cuda_decode_attention(const at::Tensor& qkv, LayerKv& kv, int64_t offset, int64_t heads,
                                                const at::Tensor& mask, const at::Tensor& alibi_slopes = {});

}  // namespace colossal::nn
