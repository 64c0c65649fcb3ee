// LayerNorm over the last axis, forward and backward, over raw float arrays (rows x cols, row-major):
//   y = (x - mean) * rstd * gamma + beta,   rstd = 1 / sqrt(var + eps)   (var: the biased variance)
// Forward keeps mean and rstd per row for the backward, which gives dx and the parameter gradients in
// one pass over (dy, x): each row stays in L1 between its two reductions and its dx. The parameter
// gradients are summed per fixed block of rows, then the blocks in order, so results never depend on
// the thread count.
#pragma once
#include <cstdint>

namespace colossal::kernels {

void layer_norm_forward(const float* x, const float* gamma, const float* beta, float* y, float* mean, float* rstd,
                        int64_t rows, int64_t cols, float eps);

// dx [rows, cols] written; dgamma and dbeta [cols] written (not accumulated).
void layer_norm_backward(const float* dy, const float* x, const float* mean, const float* rstd, const float* gamma,
                         float* dx, float* dgamma, float* dbeta, int64_t rows, int64_t cols);

}  // namespace colossal::kernels
