// What a KV cache stores per element: fp32, or a 16-bit float (IEEE fp16 or bf16, as raw bits) that
// halves the bytes every decoding step reads from the cache, the read that grows with the context while
// the weights' stays fixed (llama.cpp keeps its cache in fp16 by default, vLLM offers fp8). Keys and
// values are rounded to nearest-even when written and widened exactly when read; the arithmetic stays fp32.
#pragma once
#include <cstddef>
#include <cstdint>

namespace colossal::kernels {

enum class KvElement : uint8_t { f32, fp16, bf16 };

constexpr size_t kv_element_bytes(KvElement e) { return e == KvElement::f32 ? 4 : 2; }

}  // namespace colossal::kernels
