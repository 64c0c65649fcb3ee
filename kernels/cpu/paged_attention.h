// Attention for serving (vLLM's PagedAttention, on the CPU): one step's tokens come from different
// sequences, and each sequence's keys and values live in fixed-size blocks of one shared pool, so a
// sequence holds memory for the tokens it has, a block at a time, and finished sequences give theirs back.
// Every token first writes its key and value into its slot, then attends causally over its own
// sequence's positions [0, pos] (so the tokens of one prompt chunk see each other as in a prefill).
//
// Layouts (row-major, the pools of dims.element: kv_element.h, rows kv_row_elements(e, D) wide):
//   qkv    [N, 3, H, D]                     (each token's q | k | v, the QKV linear's output)
//   k_pool [num_blocks, H, block_size, D]   (and v_pool alike)
//   token i at position positions[i]; tables[i] is its sequence's block table: position p lives in
//   block tables[i][p / block_size], slot p % block_size
//   alibi_slopes [H] or null: ALiBi adds slope * (j - pos) to the score of key j (BLOOM)
//   out    [N, H, D]
#pragma once
#include <cstdint>

#include "kernels/cpu/kv_element.h"

namespace colossal::kernels {

struct PagedAttentionDims {
  int64_t tokens, heads, head_dim, block_size;
  float scale;   // usually 1/sqrt(head_dim)
  KvElement element = KvElement::f32;   // what the pools store (keys and values are stored as it)
};

void paged_attention(const float* qkv, void* k_pool, void* v_pool, const int64_t* positions, const int32_t* const* tables,
                     const float* alibi_slopes, float* out, const PagedAttentionDims& dims);

// Its two parts, for a caller that shares the tasks among its own threads (decode_block.h): every
// token's key and value into its slot, then task `task` = token * heads + head, whose `scores` hold
// paged_longest(positions, tokens) floats (the longest sequence attended).
void paged_write_keys_values(const float* qkv, void* k_pool, void* v_pool, const int64_t* positions,
                             const int32_t* const* tables, const PagedAttentionDims& dims);
int64_t paged_longest(const int64_t* positions, int64_t tokens);
void paged_attention_task(const float* qkv, const void* k_pool, const void* v_pool, const int64_t* positions,
                          const int32_t* const* tables, const float* alibi_slopes, float* out, const PagedAttentionDims& dims,
                          int64_t task, float* scores);

}  // namespace colossal::kernels
