// Fused AdamW on a CUDA device: every piece of a step (each a flat range of one parameter with its
// gradient and moments) updated in as few launches as the kernel's parameter space allows, a
// multi-tensor apply, rather than one launch per piece; clipping's scale applied to each gradient as it
// is read, so clipping costs no pass of its own (ATen's fused AdamW needs the gradients scaled first).
//
// The arithmetic is the CPU loop's (kernels/cpu/adamw_isa.cpp) operation for operation, each rounded
// alone (no contracted multiply-adds; IEEE square root and division) from the same float constants
// (adamw_consts): a step on the GPU gives the CPU kernel's bits, so a Gemini chunk may move between host
// and device without its trajectory changing.
//
// Declarations only, no CUDA header: built by nvcc where LibTorch is a CUDA build and nvcc is installed
// (kernels/CMakeLists.txt); "kernels/cuda/built.h" says whether it was.
#pragma once
#include <cstdint>

#include "kernels/cpu/adamw.h"

namespace colossal::kernels {

struct AdamWDevicePiece {
  float* param;
  const float* grad;
  float* exp_avg;
  float* exp_avg_sq;
  int64_t n;
};

// Updates every piece with the same hyperparameters (callers group pieces by weight decay), all in
// device memory of the current device, asynchronously on `stream` (a cudaStream_t). Pieces may have any
// length and alignment. Throws std::runtime_error with CUDA's message if a launch fails.
void adamw_step_cuda(const AdamWDevicePiece* pieces, int64_t count, const AdamWHyper& h, void* stream);

}  // namespace colossal::kernels
