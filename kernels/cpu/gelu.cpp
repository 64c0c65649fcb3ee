// GELU (tanh approximation), CPU: see gelu.h. OpenMP splits large arrays into chunks that fit in L2;
// each chunk runs the active instruction set's loop (gelu_isa.cpp).
#include "kernels/cpu/gelu.h"

#include <algorithm>

#include "kernels/cpu/isa_kernels.h"

namespace colossal::kernels {
namespace {

constexpr int64_t kChunk = 1 << 14;   // elements per task: 64 KiB of x

// chunk(begin, len) over [0, n) in kChunk pieces, across the threads when there is more than one.
template <typename Chunk>
void over_chunks(int64_t n, const Chunk& chunk) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) chunk(c * kChunk, std::min(kChunk, n - c * kChunk));
}

}  // namespace

void gelu_tanh_forward(const float* x, float* y, int64_t n) {
  const auto f = active_kernels().gelu_tanh_forward;
  over_chunks(n, [&](int64_t at, int64_t len) { f(x + at, y + at, len); });
}

void gelu_tanh_forward_with_grad(const float* x, float* y, float* dydx, int64_t n) {
  const auto f = active_kernels().gelu_tanh_forward_with_grad;
  over_chunks(n, [&](int64_t at, int64_t len) { f(x + at, y + at, dydx + at, len); });
}

}  // namespace colossal::kernels
