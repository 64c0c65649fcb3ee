// y = x W^T + b for every dense layer and the tied LM head. While training on CPU in fp32, the forward
// and both gradients go through gemm_choice.h (our GEMM or ATen's, timed per form and shape). While
// decoding on CPU, x [B, 1, in] (one new token for each of at most kGemvMaxRows sequences) with no gradient to
// record goes through kernels/cpu/gemv, which reads W once for all rows on every core, when it wins
// at that shape (kernel_choice.h decides per [in, out], whatever B is, so a batch decodes like each
// of its sequences alone). Other rows without a gradient (a prefill, a server's step with prompt chunks)
// take our GEMM or ATen's as KernelPolicy::inference_gemm says.
//
// kGemvMaxRows = 32: a server's step of 16 decoding sequences went through ATen's GEMM, where MKL packs
// the whole weight matrix on every call (a third of a loaded server's samples were that copy); the
// GEMV took opt-125m's serving throughput at 16 streams from 144 to 181 tok/s, and 16- and 32-sequence
// decodes of the GPT-2 124M shape took 0.92 and 1.00 of the time. In a step of at most 32 tokens a served
// request's bits also no longer depend on how many others share it.
#pragma once
#include <ATen/core/Tensor.h>

#include <functional>
#include <optional>
#include <vector>

namespace colossal::nn {

inline constexpr int64_t kGemvMaxRows = 32;

// x [..., in], weight [out, in], bias [out] or undefined -> [..., out]
at::Tensor linear_forward(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias = {});
// linear_forward(gelu_tanh(h), weight, bias). Training on CPU in fp32 with our GELU and GEMM path, one
// autograd node saves h alone and computes gelu(h) and its derivative again in its backward: the
// GELU's output (the product's input) and its derivative were two saved tensors of h's size, a
// quarter of a GPT block's activations, for one more pass of the GELU kernel a layer. The same
// operations in the same order, so the same bits as the two nodes. Not in a block's rerun for its
// backward (recompute.h): that graph is consumed at once, and recomputing again there only added
// h-sized buffers at the backward's peak.
at::Tensor linear_forward_after_gelu_tanh(const at::Tensor& h, const at::Tensor& weight, const at::Tensor& bias = {});

// Whether linear_forward runs the decoding GEMV for x [rows, 1, in] (CPU float, no gradient mode, rows at
// most kGemvMaxRows) against this weight: false where it cannot, nullopt while its shape is undecided
// (the first step at a shape times it), else the decided choice.
std::optional<bool> gemv_decision(const at::Tensor& weight, const at::Tensor& bias);
// The same, nothing looked up: whether this weight and bias are ones the decoding GEMV takes.
bool gemv_takes(const at::Tensor& weight, const at::Tensor& bias);

// Zero-bubble pipeline schedules run a backward in two passes: the input's gradient, which the stage
// before waits for, then the weights' gradients, which nobody waits for and which fill the schedule's
// idle time. While a queue is set on the thread, the training path's dense layers compute their input's
// gradient (and bias's) in backward and queue their weight's product dW += dy^T x, keeping dy and x
// until it runs; the other layers (norms, embeddings, the head's fused loss) compute every gradient at
// once. Each queued product sums into the weight's .grad as backward would have.
class DeferredWeightGrads {
 public:
  void add(std::function<void()> work) { work_.push_back(std::move(work)); }
  void run();   // in order, then empty
  bool empty() const { return work_.empty(); }

 private:
  std::vector<std::function<void()>> work_;
};
void defer_weight_grads(DeferredWeightGrads* queue);   // this thread's queue (null: none)

}  // namespace colossal::nn
