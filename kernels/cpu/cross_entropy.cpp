// Fused softmax cross entropy, CPU: see cross_entropy.h. Rows are split across OpenMP threads; each
// runs the active instruction set's row loop (cross_entropy_isa.cpp).
#include "kernels/cpu/cross_entropy.h"

#include <cstring>

#include "kernels/cpu/isa_kernels.h"

namespace colossal::kernels {

void softmax_cross_entropy_inplace(float* logits, const int64_t* targets, float* losses, int64_t rows, int64_t cols,
                                   float grad_scale) {
  const auto row_ce = active_kernels().softmax_ce_row;
#pragma omp parallel for schedule(static) if (rows * cols > (1 << 16))
  for (int64_t i = 0; i < rows; ++i) {
    float* row = logits + i * cols;
    if (targets[i] < 0) {
      std::memset(row, 0, sizeof(float) * static_cast<size_t>(cols));
      losses[i] = 0.0f;
      continue;
    }
    losses[i] = row_ce(row, targets[i], cols, grad_scale);
  }
}

}  // namespace colossal::kernels
