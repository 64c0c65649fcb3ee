// LayerNorm, one instruction set's copy of the per-block loops: see layer_norm.h. Plain loops over a
// row's contiguous columns that the compiler vectorises at this copy's width; a row is read from L1
// after its first pass.
#include <cmath>

#include "kernels/cpu/isa_entry.h"

namespace colossal::kernels::COLOSSAL_ISA {

void layer_norm_forward_rows(const float* __restrict x, const float* __restrict gamma, const float* __restrict beta,
                             float* __restrict y, float* __restrict mean, float* __restrict rstd, int64_t rows,
                             int64_t cols, float eps) {
  const float inv_cols = 1.0f / static_cast<float>(cols);
  for (int64_t r = 0; r < rows; ++r) {
    const float* __restrict xr = x + r * cols;
    float* __restrict yr = y + r * cols;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t c = 0; c < cols; ++c) sum += xr[c];
    const float mu = sum * inv_cols;
    float sq = 0.0f;   // two passes (the row is in L1): no cancellation when |mean| >> std
#pragma omp simd reduction(+ : sq)
    for (int64_t c = 0; c < cols; ++c) sq += (xr[c] - mu) * (xr[c] - mu);
    const float rs = 1.0f / std::sqrt(sq * inv_cols + eps);
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) yr[c] = (xr[c] - mu) * rs * gamma[c] + beta[c];
    mean[r] = mu;
    rstd[r] = rs;
  }
}

void layer_norm_backward_rows(const float* __restrict dy, const float* __restrict x, const float* __restrict mean,
                              const float* __restrict rstd, const float* __restrict gamma, float* __restrict dx,
                              float* __restrict dgamma, float* __restrict dbeta, int64_t rows, int64_t cols) {
  const float inv_cols = 1.0f / static_cast<float>(cols);
#pragma omp simd
  for (int64_t c = 0; c < cols; ++c) dgamma[c] = dbeta[c] = 0.0f;
  for (int64_t r = 0; r < rows; ++r) {
    const float* __restrict dyr = dy + r * cols;
    const float* __restrict xr = x + r * cols;
    float* __restrict dxr = dx + r * cols;
    const float mu = mean[r], rs = rstd[r];
    // With xhat = (x - mean) rstd and g = dy gamma: dx = rstd (g - mean(g) - xhat mean(g xhat)).
    float sum_g = 0.0f, sum_gx = 0.0f;
#pragma omp simd reduction(+ : sum_g, sum_gx)
    for (int64_t c = 0; c < cols; ++c) {
      const float xhat = (xr[c] - mu) * rs;
      const float g = dyr[c] * gamma[c];
      sum_g += g;
      sum_gx += g * xhat;
      dgamma[c] += dyr[c] * xhat;
      dbeta[c] += dyr[c];
    }
    const float a = sum_g * inv_cols, b = sum_gx * inv_cols;
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) dxr[c] = rs * (dyr[c] * gamma[c] - a - (xr[c] - mu) * rs * b);
  }
}

}  // namespace colossal::kernels::COLOSSAL_ISA
