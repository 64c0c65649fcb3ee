// Fused softmax cross entropy, CPU: see cross_entropy.h. exp() is vec_math.h's polynomial, which the
// compiler vectorises. target_clones builds AVX-512, AVX2 and baseline versions and picks one at load
// time, so the binary stays portable.
#include "kernels/cpu/cross_entropy.h"

#include <cmath>
#include <cstring>

#include "kernels/cpu/vec_math.h"

namespace colossal::kernels {
namespace {

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
