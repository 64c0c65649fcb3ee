// The LM head and its cross entropy as one autograd function. Logits [N, V] are computed, then
// turned into their own gradient in place by the fused kernel (kernels/cpu/cross_entropy), so the
// largest activation of a language model is held once instead of three times (logits, log-probs,
// their gradient) and read twice fewer. Backward is then just the two matmuls of the head.
#pragma once
#include <ATen/core/Tensor.h>

namespace colossal::nn {

// x [N, C], weight [V, C] (tied or not), targets [N] int64 (negative = ignored) -> mean loss over
// the targets that are not ignored. Gradients flow to x and weight.
at::Tensor lm_head_cross_entropy(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& targets);

}  // namespace colossal::nn
