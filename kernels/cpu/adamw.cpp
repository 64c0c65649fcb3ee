// Fused AdamW, CPU: see adamw.h. Threads split the buffer into chunks; each chunk runs the active
// instruction set's loop (adamw_isa.cpp).
#include "kernels/cpu/adamw.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "kernels/cpu/isa_kernels.h"

namespace colossal::kernels {

template <typename T>
AdamWConsts<T> adamw_consts(const AdamWHyper& h) {
  const double bias_correction1 = 1 - std::pow(h.beta1, static_cast<double>(h.step));
  const double bias_correction2 = 1 - std::pow(h.beta2, static_cast<double>(h.step));
  return {static_cast<T>(h.beta1),          static_cast<T>(h.beta2),
          static_cast<T>(1 - h.beta1),      static_cast<T>(1 - h.beta2),
          static_cast<T>(1 - h.lr * h.weight_decay), static_cast<T>(h.lr / bias_correction1),
          static_cast<T>(1 / std::sqrt(bias_correction2)), static_cast<T>(h.eps), static_cast<T>(h.grad_scale)};
}
template AdamWConsts<float> adamw_consts<float>(const AdamWHyper&);
template AdamWConsts<double> adamw_consts<double>(const AdamWHyper&);

template <typename T>
void adamw_step(T* param, const T* grad, T* exp_avg, T* exp_avg_sq, int64_t n, const AdamWHyper& h) {
  const AdamWConsts<T> c = adamw_consts<T>(h);
  const auto chunk = [] {
    if constexpr (std::is_same_v<T, float>) return active_kernels().adamw_f32;
    else return active_kernels().adamw_f64;
  }();
  // Small buffers are not worth waking the thread pool for.
  constexpr int64_t kGrain = 1 << 15;
#pragma omp parallel for schedule(static) if (n > 2 * kGrain)
  for (int64_t start = 0; start < n; start += kGrain) {
    const int64_t len = start + kGrain < n ? kGrain : n - start;
    chunk(param + start, grad + start, exp_avg + start, exp_avg_sq + start, len, c);
  }
}

void adamw_step_half(float* param, const uint16_t* grad, Half16 kind, float* exp_avg, float* exp_avg_sq, int64_t n,
                     const AdamWHyper& h, double grad_factor) {
  const AdamWConsts<float> c = adamw_consts<float>(h);
  const auto chunk = kind == Half16::bf16 ? active_kernels().adamw_f32_bf16 : active_kernels().adamw_f32_fp16;
  const auto factor = static_cast<float>(grad_factor);
  constexpr int64_t kGrain = 1 << 15;   // adamw_step's
#pragma omp parallel for schedule(static) if (n > 2 * kGrain)
  for (int64_t start = 0; start < n; start += kGrain) {
    const int64_t len = start + kGrain < n ? kGrain : n - start;
    chunk(param + start, grad + start, exp_avg + start, exp_avg_sq + start, len, c, factor);
  }
}

namespace {

// Fixed blocks, each summed by `block_sum` on some thread, added in block order: the result does not
// depend on the number of threads.
template <typename T, typename BlockSum>
double block_sums(const T* x, int64_t n, BlockSum block_sum) {
  constexpr int64_t kBlock = 1 << 16;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> sums(static_cast<size_t>(blocks));
#pragma omp parallel for schedule(static) if (blocks > 4)
  for (int64_t b = 0; b < blocks; ++b) sums[static_cast<size_t>(b)] = block_sum(x + b * kBlock, std::min(kBlock, n - b * kBlock));
  double total = 0;
  for (double s : sums) total += s;
  return total;
}

}  // namespace

template <typename T>
double sum_squares(const T* x, int64_t n) {
  if constexpr (std::is_same_v<T, float>) return block_sums(x, n, active_kernels().sum_squares_f32);
  else return block_sums(x, n, active_kernels().sum_squares_f64);
}

double sum_squares_half(const uint16_t* x, int64_t n, Half16 kind) {
  return block_sums(x, n, kind == Half16::bf16 ? active_kernels().sum_squares_bf16 : active_kernels().sum_squares_fp16);
}

template double sum_squares<float>(const float*, int64_t);
template double sum_squares<double>(const double*, int64_t);

template void adamw_step<float>(float*, const float*, float*, float*, int64_t, const AdamWHyper&);
template void adamw_step<double>(double*, const double*, double*, double*, int64_t, const AdamWHyper&);

}  // namespace colossal::kernels
