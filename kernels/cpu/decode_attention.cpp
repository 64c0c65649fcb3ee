// Decoding attention against the KV cache, CPU: see decode_attention.h. One task per (sequence, head)
// split across OpenMP threads when there is enough work to pay for waking them; the per-head loop is
// the active instruction set's (decode_attention_isa.cpp).
#include "kernels/cpu/decode_attention.h"

#include "kernels/cpu/isa_kernels.h"
#include "kernels/cpu/thread_scratch.h"

namespace colossal::kernels {
namespace {

// Below this many multiply-adds (scores and values, all heads) one thread does it all: waking the
// others costs a few microseconds, as much as the arithmetic of a short cache.
constexpr int64_t kParallelWork = 1 << 15;

}  // namespace

void decode_attention_task(const float* qkv, void* k_cache, void* v_cache, const uint8_t* valid, int64_t valid_stride,
                           float* out, const DecodeAttentionDims& a, int64_t task, float* scores) {
  const int64_t c = a.heads * a.head_dim, d = a.head_dim, b = task / a.heads, h = task % a.heads;
  const int64_t row = kv_row_bytes(a.element, d);
  const float* q = qkv + b * 3 * c + h * d;
  char* k = static_cast<char*>(k_cache) + task * a.capacity * row;
  char* v = static_cast<char*>(v_cache) + task * a.capacity * row;
  const auto& kernels = active_kernels();
  kernels.store_kv(q + c, k + (a.length - 1) * row, d, a.element);
  kernels.store_kv(q + 2 * c, v + (a.length - 1) * row, d, a.element);
  kernels.attention_decode_head(q, k, v, a.element, a.length, d, a.scale, a.alibi_slopes ? a.alibi_slopes[h] : 0.0f,
                                valid ? valid + b * valid_stride : nullptr, scores, out + b * c + h * d);
}

void decode_attention(const float* qkv, void* k_cache, void* v_cache, const uint8_t* valid, int64_t valid_stride,
                      float* out, const DecodeAttentionDims& a) {
  const int64_t tasks = a.batch * a.heads;
  const bool parallel = tasks > 1 && 2 * tasks * a.length * a.head_dim >= kParallelWork;
#pragma omp parallel if (parallel)
  {
    float* scores = thread_scratch(static_cast<size_t>(a.length));   // every layer of every decoding step comes here
#pragma omp for schedule(static)
    for (int64_t task = 0; task < tasks; ++task) decode_attention_task(qkv, k_cache, v_cache, valid, valid_stride, out, a, task, scores);
  }
}

}  // namespace colossal::kernels
