// Activations with fused CPU kernels. gelu_tanh is GPT-2's GELU (tanh approximation): on CPU float
// tensors one vectorised pass each way (kernels/cpu/gelu), elsewhere ATen's at::gelu(x, "tanh").
#pragma once
#include <ATen/core/Tensor.h>
#include <optional>

#include "src/nn/factory.h"

namespace colossal::nn {

at::Tensor gelu_tanh(const at::Tensor& x);
// Whether gelu_tanh of n CPU floats in no gradient mode runs the kernel: the decided choice, or nullopt
// while undecided.
std::optional<bool> gelu_tanh_decision(int64_t n);
// `act` applied to x: what an MLP's hidden layer and a head's transform compute.
at::Tensor activate(Act act, const at::Tensor& x);

}  // namespace colossal::nn
