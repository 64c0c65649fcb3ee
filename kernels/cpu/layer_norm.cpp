// LayerNorm, CPU: see layer_norm.h. Rows are split into fixed blocks across OpenMP threads; each block
// runs the active instruction set's loops (layer_norm_isa.cpp).
#include "kernels/cpu/layer_norm.h"

#include <algorithm>
#include <vector>

#include "kernels/cpu/isa_kernels.h"

namespace colossal::kernels {
namespace {

// Rows per block: the unit of both the thread split and the parameter-gradient partial sums.
constexpr int64_t kBlockRows = 32;
// Below this many elements one thread does it all (waking the pool costs a few microseconds).
constexpr int64_t kParallelElems = 1 << 14;

int64_t blocks_of(int64_t rows) { return (rows + kBlockRows - 1) / kBlockRows; }
bool worth_threads(int64_t rows, int64_t cols) { return blocks_of(rows) > 1 && rows * cols >= kParallelElems; }

}  // namespace

void layer_norm_forward(const float* x, const float* gamma, const float* beta, float* y, float* mean, float* rstd,
                        int64_t rows, int64_t cols, float eps) {
  const auto f = active_kernels().layer_norm_forward;
  const int64_t blocks = blocks_of(rows);
#pragma omp parallel for schedule(static) if (worth_threads(rows, cols))
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t r = blk * kBlockRows, n = std::min(kBlockRows, rows - r);
    f(x + r * cols, gamma, beta, y + r * cols, mean + r, rstd + r, n, cols, eps);
  }
}

void layer_norm_backward(const float* dy, const float* x, const float* mean, const float* rstd, const float* gamma,
                         float* dx, float* dgamma, float* dbeta, int64_t rows, int64_t cols) {
  const auto f = active_kernels().layer_norm_backward;
  const int64_t blocks = blocks_of(rows);
  // Per block: its dgamma partial, then its dbeta partial.
  std::vector<float> partial(static_cast<size_t>(blocks * 2 * cols));
#pragma omp parallel if (worth_threads(rows, cols))
  {
#pragma omp for schedule(static)
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t r = blk * kBlockRows, n = std::min(kBlockRows, rows - r);
      float* pg = partial.data() + blk * 2 * cols;
      f(dy + r * cols, x + r * cols, mean + r, rstd + r, gamma, dx + r * cols, pg, pg + cols, n, cols);
    }
    // Blocks summed in order, columns split across the threads.
#pragma omp for schedule(static)
    for (int64_t c = 0; c < cols; ++c) {
      float g = 0.0f, b = 0.0f;
      for (int64_t blk = 0; blk < blocks; ++blk) {
        g += partial[static_cast<size_t>(blk * 2 * cols + c)];
        b += partial[static_cast<size_t>(blk * 2 * cols + cols + c)];
      }
      dgamma[c] = g;
      dbeta[c] = b;
    }
  }
}

}  // namespace colossal::kernels
