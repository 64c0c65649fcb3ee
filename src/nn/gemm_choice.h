// The three products of a dense layer on CPU in fp32, each through kernels/cpu/gemm or ATen's BLAS
// call, whichever kernel_choice.h timed faster for that form and shape (policy field `gemm`):
//   forward       y = x W^T + b        (ATen: addmm / mm, what at::linear runs)
//   input grad    dx = dy W            (ATen: mm)
//   weight grad   dW (+)= dy^T x       (ATen: mm, or addmm_ into an existing buffer)
// x, dy are 2-D [rows, features] and contiguous; W [out, in] contiguous. Callers check gemm_applies.
#pragma once
#include <ATen/core/Tensor.h>

namespace colossal::nn {

// CPU fp32, contiguous 2-D weight whose in and out are multiples of kernels::kGemmColumnMultiple.
bool gemm_applies(const at::Tensor& x, const at::Tensor& weight);

at::Tensor gemm_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);
// The same into y [rows, out], contiguous: gemm_linear's new output, or a buffer kept from step to step
// (the LM head's logits, whose pages are already mapped). Both sides are timed writing into it.
void gemm_linear_into(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, const at::Tensor& y);
// The same without a gradient to record, under the policy's inference_gemm; its row counts vary from call
// to call, so the choice is kept per power of two of rows ("rows=64" stands for 33 to 64): a server times
// each weight a few times, not once per count.
at::Tensor gemm_linear_inference(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);
at::Tensor gemm_input_grad(const at::Tensor& dy, const at::Tensor& weight);
// into [out, in] = dy^T x, or += when accumulate (into is then a gradient buffer holding earlier sums).
void gemm_weight_grad(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& into, bool accumulate);

// weight.grad() when a backward may sum a gradient like `like` straight into it: a leaf's existing,
// contiguous gradient of the same shape, dtype and device (a view into a chunk of src/memory/chunk_store.h). Summing there is
// Megatron's gradient-accumulation fusion: no [out, in] tensor per layer per step for autograd to
// allocate, zero and add in. Autograd then receives no tensor for the weight, so a hook that must see
// every contribution to it has to run after backward. Undefined otherwise.
at::Tensor grad_buffer_of(const at::Tensor& weight, const at::Tensor& like);

// A backward's weight gradient dy^T x: summed into weight's .grad buffer when it has one (then the
// result is undefined, for autograd to receive nothing), else returned as a new tensor.
at::Tensor gemm_weight_grad_for(const at::Tensor& weight, const at::Tensor& dy, const at::Tensor& x);

}  // namespace colossal::nn
