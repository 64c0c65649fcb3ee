// Decoding attention on a CUDA device: one new query per (sequence, head) against its cached keys and
// values, for a cache of any element kind (kernels/cpu/kv_element.h: fp32, fp16, bf16, or int8 rows with
// their scales), each read as the CPU kernels read it (16-bit values widened exactly, int8 as q * scale,
// one rounding) and computed in fp32. ATen's path instead reads a narrow cache back into a new fp32 copy
// of the whole window every step and runs scaled_dot_product_attention with a mask: for a 16-bit or int8
// cache that copy costs more than the cache saves. One thread block per (sequence, head): the scores in
// shared memory (a warp per position, lanes across the head), the softmax, then the weighted values.
// It takes no host synchronisation and allocates nothing, so a captured CUDA graph can replay it.
//
// Declarations only, no CUDA header (kernels/cuda/built.h says whether nvcc built the definitions).
#pragma once
#include <cstdint>

#include "kernels/cpu/kv_element.h"

namespace colossal::kernels {

// The longest window the kernel takes (its scores live in shared memory); longer ones take ATen's path.
constexpr int64_t kCudaDecodeAttentionMaxLength = 8192;

struct CudaDecodeAttention {
  const float* q = nullptr;   // (sequence b, head h) at q + b * q_batch_stride + h * head_dim
  int64_t q_batch_stride = 0;
  const void* k = nullptr;    // [batch, heads, capacity, kv_row_elements(element, head_dim)] (v alike)
  const void* v = nullptr;
  KvElement element = KvElement::f32;
  int64_t batch = 0, heads = 0, head_dim = 0, capacity = 0;
  int64_t length = 0;             // positions attended: [0, length), the new one written already
  const bool* valid = nullptr;    // [batch, valid_stride]: false leaves a position out; null: all attend
  int64_t valid_stride = 0;
  const float* alibi_slopes = nullptr;   // [heads]: ALiBi's slope * (j - query position) on key j's score; or null
  const int64_t* query_position = nullptr;   // device, one for every sequence (a captured step's slot); or null:
  int64_t query_position_host = 0;           // this one
  float scale = 1.0f;
  float* out = nullptr;           // [batch, heads, head_dim]; a sequence with no valid position gets zeros
};

// All pointers in device memory of the current device. Asynchronous on `stream` (a cudaStream_t); throws
// std::runtime_error with CUDA's message if the launch fails.
void decode_attention_cuda(const CudaDecodeAttention& a, void* stream);

}  // namespace colossal::kernels
