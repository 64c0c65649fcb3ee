// Fused AdamW, CPU: see adamw.h. The arithmetic follows torch.optim.AdamW's order of operations
// (decay, moment updates, bias-corrected denominator, step) so results match it to float rounding.
// The per-chunk loop is built for AVX-512, AVX2 and baseline (target_clones picks at load time);
// threads split the buffer into chunks outside it.
#include "kernels/cpu/adamw.h"

#include <cmath>

namespace colossal::kernels {
namespace {

template <typename T>
struct Consts {
  T beta1, beta2, one_minus_beta1, one_minus_beta2, decay, step_size, inv_sqrt_bc2, eps;
};

template <typename T>
Consts<T> consts(const AdamWHyper& h) {
  const double bias_correction1 = 1 - std::pow(h.beta1, static_cast<double>(h.step));
  const double bias_correction2 = 1 - std::pow(h.beta2, static_cast<double>(h.step));
  return {static_cast<T>(h.beta1),          static_cast<T>(h.beta2),
          static_cast<T>(1 - h.beta1),      static_cast<T>(1 - h.beta2),
          static_cast<T>(1 - h.lr * h.weight_decay), static_cast<T>(h.lr / bias_correction1),
          static_cast<T>(1 / std::sqrt(bias_correction2)), static_cast<T>(h.eps)};
}

template <typename T>
inline __attribute__((always_inline)) void chunk(T* __restrict param, const T* __restrict grad, T* __restrict exp_avg,
                                                 T* __restrict exp_avg_sq, int64_t n, const Consts<T>& c) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const T g = grad[i];
    const T p = param[i] * c.decay;
    const T m = exp_avg[i] * c.beta1 + c.one_minus_beta1 * g;
    const T v = exp_avg_sq[i] * c.beta2 + c.one_minus_beta2 * g * g;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    const T denom = std::sqrt(v) * c.inv_sqrt_bc2 + c.eps;
    param[i] = p - c.step_size * (m / denom);
  }
}

// One clone set per element type (target_clones cannot apply to a template).
__attribute__((target_clones("avx512f", "avx2", "default")))
void run_chunk(float* p, const float* g, float* m, float* v, int64_t n, const Consts<float>& c) { chunk(p, g, m, v, n, c); }

__attribute__((target_clones("avx512f", "avx2", "default")))
void run_chunk(double* p, const double* g, double* m, double* v, int64_t n, const Consts<double>& c) { chunk(p, g, m, v, n, c); }

}  // namespace

template <typename T>
void adamw_step(T* param, const T* grad, T* exp_avg, T* exp_avg_sq, int64_t n, const AdamWHyper& h) {
  const Consts<T> c = consts<T>(h);
  // Small buffers are not worth waking the thread pool for.
  constexpr int64_t kGrain = 1 << 15;
#pragma omp parallel for schedule(static) if (n > 2 * kGrain)
  for (int64_t start = 0; start < n; start += kGrain) {
    const int64_t len = start + kGrain < n ? kGrain : n - start;
    run_chunk(param + start, grad + start, exp_avg + start, exp_avg_sq + start, len, c);
  }
}

template void adamw_step<float>(float*, const float*, float*, float*, int64_t, const AdamWHyper&);
template void adamw_step<double>(double*, const double*, double*, double*, int64_t, const AdamWHyper&);

}  // namespace colossal::kernels
