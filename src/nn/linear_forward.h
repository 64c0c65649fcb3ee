// y = x W^T + b for every dense layer and the tied LM head. While training on CPU in fp32, the forward
// and both gradients go through gemm_choice.h (our GEMM or ATen's, timed per form and shape). While
// decoding on CPU, x [B, 1, in] (one new token for each of at most kGemvMaxRows sequences) with no gradient to
// record goes through kernels/cpu/gemv, which reads W once for all rows on every core, when it wins
// at that shape (kernel_choice.h decides per [in, out], whatever B is, so a batch decodes like each
// of its sequences alone).
#pragma once
#include <ATen/core/Tensor.h>

namespace colossal::nn {

inline constexpr int64_t kGemvMaxRows = 8;

// x [..., in], weight [out, in], bias [out] or undefined -> [..., out]
at::Tensor linear_forward(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias = {});

}  // namespace colossal::nn
