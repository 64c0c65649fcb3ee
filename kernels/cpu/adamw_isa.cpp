// Fused AdamW and the gradient norm's sum of squares, one instruction set's copy of the per-chunk
// loops: see adamw.h. The arithmetic follows
// torch.optim.AdamW's order of operations (decay, moment updates, bias-corrected denominator, step)
// so results match it to float rounding. The loop is memory-bound: vector width is all it needs.
#include <cmath>

#include "kernels/cpu/isa_entry.h"
#include "kernels/cpu/simd.h"

namespace colossal::kernels::COLOSSAL_ISA {
namespace {

template <typename T>
COLOSSAL_INLINE void chunk(T* __restrict param, const T* __restrict grad, T* __restrict exp_avg, T* __restrict exp_avg_sq,
                           int64_t n, const AdamWConsts<T>& c) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const T g = grad[i] * c.grad_scale;   // exact when 1
    const T p = param[i] * c.decay;
    const T m = exp_avg[i] * c.beta1 + c.one_minus_beta1 * g;
    const T v = exp_avg_sq[i] * c.beta2 + c.one_minus_beta2 * g * g;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    const T denom = std::sqrt(v) * c.inv_sqrt_bc2 + c.eps;
    param[i] = p - c.step_size * (m / denom);
  }
}

// Squares summed in double: the gradient norm in one read of the gradients, exact enough that a norm
// over millions of float gradients does not drift with their order. The block is read as four
// interleaved streams, each with its own partial sums: one stream per core left the hardware
// prefetchers short of requests (23 ms for 103M floats on 2 Xeon cores, against 16 ms with four; AdamW,
// reading four arrays, already streamed at twice the rate).
template <typename T>
COLOSSAL_INLINE double sum_sq(const T* __restrict x, int64_t n) {
  constexpr int kLanes = 8, kParts = 4;
  const int64_t part = n / (kParts * kLanes) * kLanes;
  double sums[kParts][kLanes] = {};
  for (int64_t i = 0; i < part; i += kLanes) {
#pragma omp simd
    for (int j = 0; j < kLanes; ++j)
      for (int k = 0; k < kParts; ++k) {
        const double v = static_cast<double>(x[k * part + i + j]);
        sums[k][j] += v * v;
      }
  }
  double s = 0;
  for (int64_t i = kParts * part; i < n; ++i) s += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  for (const auto& lane : sums)
    for (double p : lane) s += p;
  return s;
}

}  // namespace

double sum_squares_f32(const float* x, int64_t n) { return sum_sq(x, n); }
double sum_squares_f64(const double* x, int64_t n) { return sum_sq(x, n); }

void adamw_chunk_f32(float* p, const float* g, float* m, float* v, int64_t n, const AdamWConsts<float>& c) {
  chunk(p, g, m, v, n, c);
}
void adamw_chunk_f64(double* p, const double* g, double* m, double* v, int64_t n, const AdamWConsts<double>& c) {
  chunk(p, g, m, v, n, c);
}

}  // namespace colossal::kernels::COLOSSAL_ISA
