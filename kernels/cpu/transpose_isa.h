// Register transposes for the *_isa.cpp kernels (each copy includes this with its own flags).
#pragma once
#include <cstdint>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "kernels/cpu/simd.h"

namespace colossal::kernels::COLOSSAL_ISA {
namespace {

#if defined(__AVX2__)
// 8 rows of 8 floats (`stride` apart) -> their 8 columns as rows (`ld` apart), in registers.
COLOSSAL_INLINE void transpose_8x8(const float* src, int64_t stride, float* dst, int64_t ld) {
  __m256 r[8], t[8];
  for (int k = 0; k < 8; ++k) r[k] = _mm256_loadu_ps(src + k * stride);
  for (int k = 0; k < 8; k += 2) {
    t[k] = _mm256_unpacklo_ps(r[k], r[k + 1]);       // a0 b0 a1 b1 | a4 b4 a5 b5
    t[k + 1] = _mm256_unpackhi_ps(r[k], r[k + 1]);   // a2 b2 a3 b3 | a6 b6 a7 b7
  }
  for (int k = 0; k < 8; k += 4) {
    r[k] = _mm256_shuffle_ps(t[k], t[k + 2], 0x44);       // a0 b0 c0 d0 | a4 b4 c4 d4
    r[k + 1] = _mm256_shuffle_ps(t[k], t[k + 2], 0xEE);   // a1 b1 c1 d1 | ...
    r[k + 2] = _mm256_shuffle_ps(t[k + 1], t[k + 3], 0x44);
    r[k + 3] = _mm256_shuffle_ps(t[k + 1], t[k + 3], 0xEE);
  }
  for (int k = 0; k < 4; ++k) {
    _mm256_storeu_ps(dst + k * ld, _mm256_permute2f128_ps(r[k], r[k + 4], 0x20));
    _mm256_storeu_ps(dst + (k + 4) * ld, _mm256_permute2f128_ps(r[k], r[k + 4], 0x31));
  }
}
#endif

}  // namespace
}  // namespace colossal::kernels::COLOSSAL_ISA
