// Elementary functions as plain inline float arithmetic, so loops that call them vectorise (libm's
// expf/tanhf do not without -ffast-math). Shared by the CPU kernels; accuracy noted per function.
// static and always inlined: each instruction set's copy of a kernel gets its own code (see simd.h).
#pragma once
#include <cstdint>
#include <cstring>

namespace colossal::kernels {

// exp(x) for x <= 0 (Cephes-style: range reduction by ln 2, degree-6 polynomial); relative error ~2e-7.
static inline __attribute__((always_inline)) float exp_nonpositive(float x) {
  x = x < -87.0f ? -87.0f : x;
  const float t = x * 1.44269504088896341f;
  const float k = (t + 12582912.0f) - 12582912.0f;   // round to nearest (1.5 * 2^23 trick)
  const float r = x - k * 0.693359375f + k * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float e = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(k) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return e * scale;
}

// tanh(x) = sign(x) (1 - e) / (1 + e) with e = exp(-2|x|) <= 1, so nothing overflows; absolute
// error ~1e-7 (relative error grows only where tanh itself is below ~1e-3).
static inline __attribute__((always_inline)) float tanh_bounded(float x) {
  const float a = x < 0 ? -x : x;
  const float e = exp_nonpositive(-2.0f * a);
  const float t = (1.0f - e) / (1.0f + e);
  return x < 0 ? -t : t;
}

// s[j] = exp(s[j] - max) over [0, n) (n >= 1, no -inf), with max the row's maximum; returns the sum (a
// softmax's denominator). Each instruction set's copy of a kernel vectorises it at its own width.
static inline __attribute__((always_inline)) float exp_shifted_inplace(float* __restrict s, int64_t n, float& max) {
  max = s[0];
#pragma omp simd reduction(max : max)
  for (int64_t j = 0; j < n; ++j) max = s[j] > max ? s[j] : max;
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < n; ++j) {
    s[j] = exp_nonpositive(s[j] - max);
    sum += s[j];
  }
  return sum;
}

}  // namespace colossal::kernels
