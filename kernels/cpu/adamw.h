// Fused AdamW over flat buffers: one pass reads param, grad and both moments once and writes
// param and moments once (torch's per-tensor AdamW makes several passes). Clipping's scale is applied
// to each gradient as it is read, so clipping costs no pass of its own (torch scales the gradients in
// place first: the same float product, one more read and write of every gradient). Raw pointers, no LibTorch:
// the same call serves a whole model, a ZeRO shard or a Gemini chunk.
#pragma once
#include <cstdint>

#include "kernels/cpu/accumulate.h"   // Half16

namespace colossal::kernels {

struct AdamWHyper {
  double lr;
  double beta1, beta2;
  double eps;
  double weight_decay;   // decoupled: p -= lr * wd * p
  int64_t step;          // 1-based step count after this update (for bias correction)
  double grad_scale = 1;   // gradients are read times this (gradient clipping folded into the pass)
};

// The update's constants in the element type, computed once per call: the CPU loops and the CUDA
// kernel (kernels/cuda/adamw.h) read the same floats, so both devices round alike.
template <typename T>
struct AdamWConsts {
  T beta1, beta2, one_minus_beta1, one_minus_beta2, decay, step_size, inv_sqrt_bc2, eps, grad_scale;
};
template <typename T>
AdamWConsts<T> adamw_consts(const AdamWHyper& h);

// Updates n elements in place. T = float or double. Parallel over OpenMP threads, vectorised inside.
template <typename T>
void adamw_step(T* param, const T* grad, T* exp_avg, T* exp_avg_sq, int64_t n, const AdamWHyper& h);

// The same update reading gradients kept in 16 bits (Half16's bf16 or fp16, as raw bits), each taken as
// float(grad[i]) * float(grad_factor) and then times h.grad_scale: the bits adamw_step gives on the
// widened gradients after an fp32 `mul_(grad_factor)`, with no fp32 copy of them.
void adamw_step_half(float* param, const uint16_t* grad, Half16 kind, float* exp_avg, float* exp_avg_sq, int64_t n,
                     const AdamWHyper& h, double grad_factor);

// The sum of x[i]^2 in double: one read of the buffer, on OpenMP threads over fixed blocks whose sums
// are added in block order, so the result does not depend on the number of threads.
template <typename T>
double sum_squares(const T* x, int64_t n);
// The same over 16-bit values (Half16's bits): exactly sum_squares<float> of their widened copy.
double sum_squares_half(const uint16_t* x, int64_t n, Half16 kind);

}  // namespace colossal::kernels
