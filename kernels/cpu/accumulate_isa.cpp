// One instruction set's loops of accumulate.h: 16-bit floats widened exactly and added into fp32.
#include "kernels/cpu/isa_entry.h"
#include "kernels/cpu/half_widen.h"

namespace colossal::kernels::COLOSSAL_ISA {

void accumulate_bf16(float* __restrict dst, const uint16_t* __restrict src, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] += bf16_to_float(src[i]);
}

void accumulate_fp16(float* __restrict dst, const uint16_t* __restrict src, int64_t n) {
  int64_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8) {
    const __m256 wide = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
    _mm256_storeu_ps(dst + i, _mm256_add_ps(_mm256_loadu_ps(dst + i), wide));
  }
#endif
  for (; i < n; ++i) dst[i] += half_to_float(src[i]);
}

}  // namespace colossal::kernels::COLOSSAL_ISA
