// GELU (tanh approximation), CPU: see gelu.h. OpenMP splits large arrays into chunks that fit in L2;
// each chunk runs the active instruction set's loop (gelu_isa.cpp).
#include "kernels/cpu/gelu.h"

#include <algorithm>

#include "kernels/cpu/isa_kernels.h"

namespace colossal::kernels {
namespace {

constexpr int64_t kChunk = 1 << 14;   // elements per task: 64 KiB of x

}  // namespace

void gelu_tanh_forward(const float* x, float* y, int64_t n) {
  const auto f = active_kernels().gelu_tanh_forward;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t begin = c * kChunk;
    f(x + begin, y + begin, std::min(kChunk, n - begin));
  }
}

void gelu_tanh_forward_with_grad(const float* x, float* y, float* dydx, int64_t n) {
  const auto f = active_kernels().gelu_tanh_forward_with_grad;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t begin = c * kChunk;
    f(x + begin, y + begin, dydx + begin, std::min(kChunk, n - begin));
  }
}

}  // namespace colossal::kernels
