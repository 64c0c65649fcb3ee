// Fused AdamW and the gradient norm's sum of squares, one instruction set's copy of the per-chunk
// loops: see adamw.h. The arithmetic follows
// torch.optim.AdamW's order of operations (decay, moment updates, bias-corrected denominator, step)
// so results match it to float rounding. The loop is memory-bound: vector width is all it needs.
#include <cmath>
#include <vector>

#include "kernels/cpu/isa_entry.h"
#include "kernels/cpu/half_widen.h"
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

// Gradients kept in 16 bits (compact gradient shards): widened a block at a time into an L1 buffer,
// times `factor` (what the shard still owes: a loss scale undone) as ATen's float multiply rounds it,
// then the fp32 loop over the block. The update's bits are those of widening the whole shard, scaling
// it and running the fp32 loop, without the fp32 copy's write and read (4 of the 2 + 4 bytes a
// gradient element costs that way).
template <void (*Widen)(const uint16_t*, float*, int64_t)>
COLOSSAL_INLINE void half_chunk(float* p, const uint16_t* g, float* m, float* v, int64_t n, const AdamWConsts<float>& c, float factor) {
  constexpr int64_t kBlock = 1024;
  alignas(64) float wide[kBlock];
  for (int64_t s = 0; s < n; s += kBlock) {
    const int64_t len = n - s < kBlock ? n - s : kBlock;
    Widen(g + s, wide, len);
    if (factor != 1.0f)
#pragma omp simd
      for (int64_t i = 0; i < len; ++i) wide[i] *= factor;
    chunk(p + s, wide, m + s, v + s, len, c);
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

// 16-bit values widened first into this thread's buffer, then the fp32 loop: the sum over a block is
// the one sum_squares_f32 gives over the widened values, bit for bit, so compact gradient shards have
// the norm the same gradients have in fp32 shards.
template <void (*Widen)(const uint16_t*, float*, int64_t)>
double half_sum_sq(const uint16_t* x, int64_t n) {
  thread_local std::vector<float> wide;
  if (static_cast<int64_t>(wide.size()) < n) wide.resize(static_cast<size_t>(n));
  Widen(x, wide.data(), n);
  return sum_sq(wide.data(), n);
}
double sum_squares_bf16(const uint16_t* x, int64_t n) { return half_sum_sq<widen_bf16>(x, n); }
double sum_squares_fp16(const uint16_t* x, int64_t n) { return half_sum_sq<widen_fp16>(x, n); }

void adamw_chunk_f32(float* p, const float* g, float* m, float* v, int64_t n, const AdamWConsts<float>& c) {
  chunk(p, g, m, v, n, c);
}
void adamw_chunk_f32_bf16(float* p, const uint16_t* g, float* m, float* v, int64_t n, const AdamWConsts<float>& c, float factor) {
  half_chunk<widen_bf16>(p, g, m, v, n, c, factor);
}
void adamw_chunk_f32_fp16(float* p, const uint16_t* g, float* m, float* v, int64_t n, const AdamWConsts<float>& c, float factor) {
  half_chunk<widen_fp16>(p, g, m, v, n, c, factor);
}
void adamw_chunk_f64(double* p, const double* g, double* m, double* v, int64_t n, const AdamWConsts<double>& c) {
  chunk(p, g, m, v, n, c);
}

}  // namespace colossal::kernels::COLOSSAL_ISA
