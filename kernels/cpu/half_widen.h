// 16-bit floats (bf16 or IEEE fp16, as raw bits) widened to float exactly, and floats narrowed to them
// rounding to nearest-even as ATen's conversions do, for one instruction set's copy of the loops that
// read or write them (accumulate_isa.cpp, adamw_isa.cpp, decode_attention_isa.cpp): include from
// *_isa.cpp only, where COLOSSAL_ISA names the copy.
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

// float to bf16, nearest-even; NaN to the quiet 0x7fc0 (c10::BFloat16's rule, so the bits match ATen's).
inline uint16_t float_to_bf16(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  return f != f ? uint16_t{0x7fc0u} : static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

// float to IEEE half, nearest-even, overflow to infinity, subnormals kept, NaN to the quiet 0x7e00: the
// tail of F16C's loops and the whole loop without F16C.
inline uint16_t float_to_half(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f), a = bits & 0x7fffffffu;
  const auto sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  if (a > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (a >= 0x477ff000u) return sign | 0x7c00u;  // rounds to 65520 or more: infinity (or it was one)
  if (a >= 0x38800000u) {                       // a normal half: drop 13 mantissa bits, nearest-even
    const uint32_t rounded = a + 0xfffu + ((a >> 13) & 1u);
    return sign | static_cast<uint16_t>((rounded >> 13) - (112u << 10));
  }
  const uint32_t exponent = a >> 23;   // below 2^-14: a subnormal half (or zero), units of 2^-24
  if (exponent < 102) return sign;     // under half of 2^-24: zero
  const uint32_t mantissa = (a & 0x7fffffu) | 0x800000u, shift = 126 - exponent;   // 14..24
  uint32_t h = mantissa >> shift;
  const uint32_t rest = mantissa & ((1u << shift) - 1), half = 1u << (shift - 1);
  if (rest > half || (rest == half && (h & 1u))) ++h;   // may carry into the smallest normal: right bits
  return sign | static_cast<uint16_t>(h);
}

// dst[i] = bf16 or half bits of src[i] for i < n.
inline void narrow_bf16(const float* __restrict src, uint16_t* __restrict dst, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = float_to_bf16(src[i]);
}

inline void narrow_fp16(const float* __restrict src, uint16_t* __restrict dst, int64_t n) {
  int64_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#endif
  for (; i < n; ++i) dst[i] = float_to_half(src[i]);
}

}  // namespace colossal::kernels::COLOSSAL_ISA
