// What a KV cache stores per element: fp32, a 16-bit float (IEEE fp16 or bf16, as raw bits), or int8
// with one fp32 scale per row (a position's head of d values), the bytes every decoding step reads from
// the cache being the read that grows with the context while the weights' stays fixed (llama.cpp keeps
// its cache in fp16 by default and offers q8_0; vLLM offers fp8). 16-bit keys and values are rounded to
// nearest-even when written and widened exactly when read; int8 rows are quantized symmetrically
// (the rule below) and read as q * scale. The arithmetic stays fp32.
#pragma once
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace colossal::kernels {

enum class KvElement : uint8_t { f32, fp16, bf16, int8 };

constexpr size_t kv_element_bytes(KvElement e) { return e == KvElement::f32 ? 4 : e == KvElement::int8 ? 1 : 2; }

// The C++ type of one stored element of kind E (16-bit floats as their raw bits), for the CPU and CUDA
// kernels alike.
template <KvElement E>
using KvStored = std::conditional_t<E == KvElement::f32, float, std::conditional_t<E == KvElement::int8, int8_t, uint16_t>>;

// An int8 row is its d values then its scale's 4 bytes (fp32, native order), so that a row stays one
// unit every copy, gather and block of the cache moves whole: the caches' last dimension is
// kv_row_elements(e, d), not d.
constexpr int64_t kKvScaleBytes = 4;

// Stored elements a row of d keys or values takes.
constexpr int64_t kv_row_elements(KvElement e, int64_t d) { return e == KvElement::int8 ? d + kKvScaleBytes : d; }
constexpr int64_t kv_row_bytes(KvElement e, int64_t d) { return kv_row_elements(e, d) * static_cast<int64_t>(kv_element_bytes(e)); }

// The int8 row's rule, which ATen's side (src/nn/kv_storage.h) spells the same way, operation for
// operation, so both write the same bytes: amax = max |x|; scale = amax / 127; q = x * (127 / amax)
// rounded to nearest-even and clamped to [-127, 127]. A row whose amax is below kKvInt8Smallest (zeros,
// or values so small that 127 / amax would overflow) stores q = 0. A value reads back as float(q) *
// scale, one rounding. Rows holding infinities or NaNs store unspecified integers (their fp32 attention
// is not finite either).
constexpr float kKvInt8Max = 127.0f;
constexpr float kKvInt8Smallest = 1e-30f;

}  // namespace colossal::kernels
