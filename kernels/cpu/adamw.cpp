// Fused AdamW, CPU: see adamw.h. The arithmetic follows torch.optim.AdamW's order of operations
// (decay, moment updates, bias-corrected denominator, step) so results match it to float rounding.
#include "kernels/cpu/adamw.h"

#include <cmath>
#include <omp.h>

namespace colossal::kernels {

template <typename T>
void adamw_step(T* __restrict param, const T* __restrict grad, T* __restrict exp_avg,
                T* __restrict exp_avg_sq, int64_t n, const AdamWHyper& h) {
  const T beta1 = static_cast<T>(h.beta1), beta2 = static_cast<T>(h.beta2);
  const T one_minus_beta1 = static_cast<T>(1 - h.beta1), one_minus_beta2 = static_cast<T>(1 - h.beta2);
  const T decay = static_cast<T>(1 - h.lr * h.weight_decay);
  const double bias_correction1 = 1 - std::pow(h.beta1, static_cast<double>(h.step));
  const double bias_correction2 = 1 - std::pow(h.beta2, static_cast<double>(h.step));
  const T step_size = static_cast<T>(h.lr / bias_correction1);
  const T inv_sqrt_bc2 = static_cast<T>(1 / std::sqrt(bias_correction2));
  const T eps = static_cast<T>(h.eps);

  // Small buffers are not worth waking the thread pool for.
  constexpr int64_t kGrain = 1 << 15;
#pragma omp parallel for schedule(static) if (n > 2 * kGrain)
  for (int64_t start = 0; start < n; start += kGrain) {
    const int64_t end = start + kGrain < n ? start + kGrain : n;
#pragma omp simd
    for (int64_t i = start; i < end; ++i) {
      const T g = grad[i];
      T p = param[i] * decay;
      T m = exp_avg[i] * beta1 + one_minus_beta1 * g;
      T v = exp_avg_sq[i] * beta2 + one_minus_beta2 * g * g;
      exp_avg[i] = m;
      exp_avg_sq[i] = v;
      const T denom = std::sqrt(v) * inv_sqrt_bc2 + eps;
      param[i] = p - step_size * (m / denom);
    }
  }
}

template void adamw_step<float>(float*, const float*, float*, float*, int64_t, const AdamWHyper&);
template void adamw_step<double>(double*, const double*, double*, double*, int64_t, const AdamWHyper&);

}  // namespace colossal::kernels
