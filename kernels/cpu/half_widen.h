// 16-bit floats (bf16 or IEEE fp16, as raw bits) widened to float exactly, for one instruction set's
// copy of the loops that read them (accumulate_isa.cpp, adamw_isa.cpp): include from *_isa.cpp only,
// where COLOSSAL_ISA names the copy.
#pragma once
#include <bit>
#include <cstdint>
#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace colossal::kernels::COLOSSAL_ISA {

inline float bf16_to_float(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

// IEEE half to float, exactly (subnormals, infinities and NaNs included): the tail of F16C's loops, and
// the whole loop without F16C.
inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  uint32_t bits = 0;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {   // subnormal: shift the leading one into the implicit bit
    uint32_t shifts = 0;
    while (!(mantissa & 0x400u)) {
      mantissa <<= 1;
      ++shifts;
    }
    bits = sign | ((113 - shifts) << 23) | ((mantissa & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(bits);
}

// dst[i] = float(src[i]) for i < n.
inline void widen_bf16(const uint16_t* __restrict src, float* __restrict dst, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(src[i]);
}

inline void widen_fp16(const uint16_t* __restrict src, float* __restrict dst, int64_t n) {
  int64_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
#endif
  for (; i < n; ++i) dst[i] = half_to_float(src[i]);
}

}  // namespace colossal::kernels::COLOSSAL_ISA
