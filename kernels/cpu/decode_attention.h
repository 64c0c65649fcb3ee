// Attention of one new token per sequence against its KV cache (the decoding step of generation), CPU.
// ATen would run it as a dozen operations per layer (split q/k/v, two cache copies, narrows, SDPA with
// its own scratch, a transpose back); at one token each of those costs more than the arithmetic. Here
// one call writes the new key and value into the cache and attends, one task per (sequence, head).
//
// Layouts (row-major, the caches of dims.element: kv_element.h, whose rows are kv_row_elements(e, D)
// wide: D, or D and a scale for int8):
//   qkv      [B, 3, H, D]         (the QKV linear's output for the new token: q | k | v)
//   k_cache  [B, H, capacity, D]  (and v_cache alike; positions [0, length-1) already filled)
//   valid    [B, valid_stride]    (optional, 1 = may attend; e.g. 0 on left padding)
//   out      [B, H, D]            (so out viewed as [B, 1, C] is the input of the output projection)
#pragma once
#include <cstdint>

#include "kernels/cpu/kv_element.h"

namespace colossal::kernels {

struct DecodeAttentionDims {
  int64_t batch, heads, head_dim;
  int64_t capacity;   // positions the cache holds
  int64_t length;     // positions attended, the new one included (it is written at length - 1)
  float scale;        // usually 1/sqrt(head_dim)
  const float* alibi_slopes = nullptr;   // [heads]: ALiBi's slope * (j - (length - 1)) on key j's score (BLOOM); or null
  KvElement element = KvElement::f32;     // what the caches store (the new key and value are stored as it)
};

// A sequence with no valid position gets a zero output.
void decode_attention(const float* qkv, void* k_cache, void* v_cache, const uint8_t* valid, int64_t valid_stride,
                      float* out, const DecodeAttentionDims& dims);

// Its task `task` = sequence * heads + head alone, `scores` dims.length floats of the caller's: for a caller
// that shares the tasks among its own threads (decode_block.h).
void decode_attention_task(const float* qkv, void* k_cache, void* v_cache, const uint8_t* valid, int64_t valid_stride,
                           float* out, const DecodeAttentionDims& dims, int64_t task, float* scores);

}  // namespace colossal::kernels
