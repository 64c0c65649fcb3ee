// Paged attention for serving, CPU: see paged_attention.h. Writes every token's key and value, then one
// task per (token, head) across OpenMP threads; the per-head loop is the active instruction set's
// (decode_attention_isa.cpp's attention_paged_head).
#include "kernels/cpu/paged_attention.h"

#include "kernels/cpu/isa_kernels.h"
#include "kernels/cpu/thread_scratch.h"

namespace colossal::kernels {

void paged_write_keys_values(const float* qkv, void* k_pool, void* v_pool, const int64_t* positions,
                             const int32_t* const* tables, const PagedAttentionDims& a) {
  const int64_t h = a.heads, d = a.head_dim, c = h * d, bs = a.block_size, row = kv_row_bytes(a.element, d);
  const auto& kernels = active_kernels();
  for (int64_t i = 0; i < a.tokens; ++i) {
    const int64_t p = positions[i], block = tables[i][p / bs], slot = p % bs;
    for (int64_t head = 0; head < h; ++head) {
      const int64_t at = ((block * h + head) * bs + slot) * row;
      kernels.store_kv(qkv + i * 3 * c + c + head * d, static_cast<char*>(k_pool) + at, d, a.element);
      kernels.store_kv(qkv + i * 3 * c + 2 * c + head * d, static_cast<char*>(v_pool) + at, d, a.element);
    }
  }
}

int64_t paged_longest(const int64_t* positions, int64_t tokens) {
  int64_t longest = 0;
  for (int64_t i = 0; i < tokens; ++i) longest = positions[i] + 1 > longest ? positions[i] + 1 : longest;
  return longest;
}

void paged_attention_task(const float* qkv, const void* k_pool, const void* v_pool, const int64_t* positions,
                          const int32_t* const* tables, const float* alibi_slopes, float* out, const PagedAttentionDims& a,
                          int64_t task, float* scores) {
  const int64_t h = a.heads, d = a.head_dim, c = h * d, bs = a.block_size, i = task / h, head = task % h;
  const int64_t row = kv_row_elements(a.element, d);       // stored elements of a row (int8's scale included)
  const int64_t head_at = head * bs * kv_row_bytes(a.element, d);   // bytes into each block
  active_kernels().attention_paged_head(qkv + i * 3 * c + head * d, static_cast<const char*>(k_pool) + head_at,
                                        static_cast<const char*>(v_pool) + head_at, a.element, tables[i], positions[i] + 1, bs,
                                        h * bs * row, d, a.scale, alibi_slopes ? alibi_slopes[head] : 0.0f, scores, out + i * c + head * d);
}

void paged_attention(const float* qkv, void* k_pool, void* v_pool, const int64_t* positions, const int32_t* const* tables,
                     const float* alibi_slopes, float* out, const PagedAttentionDims& a) {
  // keys and values first: a chunk's later tokens read its earlier ones
  paged_write_keys_values(qkv, k_pool, v_pool, positions, tables, a);
  const int64_t longest = paged_longest(positions, a.tokens);
  int64_t work = 0;
  for (int64_t i = 0; i < a.tokens; ++i) work += 2 * (positions[i] + 1) * a.heads * a.head_dim;
  const int64_t tasks = a.tokens * a.heads;
#pragma omp parallel if (tasks > 1 && work >= (1 << 15))
  {
    float* scores = thread_scratch(static_cast<size_t>(longest));
#pragma omp for schedule(static)
    for (int64_t task = 0; task < tasks; ++task) paged_attention_task(qkv, k_pool, v_pool, positions, tables, alibi_slopes, out, a, task, scores);
  }
}

}  // namespace colossal::kernels
