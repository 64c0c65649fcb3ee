// GELU (tanh approximation), one instruction set's copy of the per-chunk loops: see gelu.h. Plain
// elementwise loops that the compiler vectorises at this copy's width; gelu.cpp splits the array.
#include "kernels/cpu/isa_entry.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/vec_math.h"

namespace colossal::kernels::COLOSSAL_ISA {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;

}  // namespace

void gelu_forward_chunk(const float* __restrict x, float* __restrict y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float t = tanh_bounded(kSqrt2OverPi * (v + kCubic * v * v * v));
    y[i] = 0.5f * v * (1.0f + t);
  }
}

// d gelu / dx = (1 + t) / 2 + x (1 - t^2) du/dx / 2, with t = tanh(u) shared with y.
void gelu_forward_grad_chunk(const float* __restrict x, float* __restrict y, float* __restrict dydx, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float t = tanh_bounded(kSqrt2OverPi * (v + kCubic * v * v * v));   // as in gelu_forward_chunk, so y is too
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kCubic * (v * v));
    y[i] = 0.5f * v * (1.0f + t);
    dydx[i] = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du;
  }
}

}  // namespace colossal::kernels::COLOSSAL_ISA
