// Fused softmax cross entropy, CPU: see cross_entropy.h. exp() is a Cephes-style polynomial the
// compiler vectorises (libm's expf does not vectorise without -ffast-math); relative error ~2e-7.
// target_clones builds AVX-512, AVX2 and baseline versions and picks one at load time, so the
// binary stays portable.
#include "kernels/cpu/cross_entropy.h"

#include <cmath>
#include <cstring>

namespace colossal::kernels {
namespace {

// exp(x) for x <= 0 (callers subtract the row maximum first).
inline float exp_nonpositive(float x) {
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

__attribute__((target_clones("avx512f", "avx2", "default")))
float row_softmax_ce(float* __restrict row, int64_t target, int64_t cols, float grad_scale) {
  float max = row[0];
#pragma omp simd reduction(max : max)
  for (int64_t j = 0; j < cols; ++j) max = row[j] > max ? row[j] : max;
  const float target_logit = row[target];
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < cols; ++j) {
    const float e = exp_nonpositive(row[j] - max);
    row[j] = e;
    sum += e;
  }
  const float scale = grad_scale / sum;
#pragma omp simd
  for (int64_t j = 0; j < cols; ++j) row[j] *= scale;
  row[target] -= grad_scale;
  return std::log(sum) + max - target_logit;
}

}  // namespace

void softmax_cross_entropy_inplace(float* logits, const int64_t* targets, float* losses, int64_t rows, int64_t cols,
                                   float grad_scale) {
#pragma omp parallel for schedule(static) if (rows * cols > (1 << 16))
  for (int64_t i = 0; i < rows; ++i) {
    float* row = logits + i * cols;
    if (targets[i] < 0) {
      std::memset(row, 0, sizeof(float) * static_cast<size_t>(cols));
      losses[i] = 0.0f;
      continue;
    }
    losses[i] = row_softmax_ce(row, targets[i], cols, grad_scale);
  }
}

}  // namespace colossal::kernels
