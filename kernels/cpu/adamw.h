// Fused AdamW over flat buffers: one pass reads param, grad and both moments once and writes
// param and moments once (torch's per-tensor AdamW makes several passes). Raw pointers, no LibTorch:
// the same call serves a whole model, a ZeRO shard or a Gemini chunk.
#pragma once
#include <cstdint>

namespace colossal::kernels {

struct AdamWHyper {
  double lr;
  double beta1, beta2;
  double eps;
  double weight_decay;   // decoupled: p -= lr * wd * p
  int64_t step;          // 1-based step count after this update (for bias correction)
};

// Updates n elements in place. T = float or double. Parallel over OpenMP threads, vectorised inside.
template <typename T>
void adamw_step(T* param, const T* grad, T* exp_avg, T* exp_avg_sq, int64_t n, const AdamWHyper& h);

}  // namespace colossal::kernels
