// Fused softmax cross entropy, one instruction set's copy of the per-row loop: see cross_entropy.h.
// exp() is vec_math.h's polynomial, which the compiler vectorises at this copy's width.
#include <cmath>

#include "kernels/cpu/isa_entry.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/vec_math.h"

namespace colossal::kernels::COLOSSAL_ISA {

float softmax_ce_row(float* __restrict row, int64_t target, int64_t cols, float grad_scale) {
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

}  // namespace colossal::kernels::COLOSSAL_ISA
