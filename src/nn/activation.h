// Activations with fused CPU kernels. gelu_tanh is GPT-2's GELU (tanh approximation): on CPU float
// tensors one vectorised pass each way (kernels/cpu/gelu), elsewhere ATen's at::gelu(x, "tanh").
#pragma once
#include <ATen/core/Tensor.h>

#include "src/nn/factory.h"

namespace colossal::nn {

at::Tensor gelu_tanh(const at::Tensor& x);
// Whether gelu_tanh(x) runs our kernel (a CPU float x and our kernel chosen for its size, timed on the
// first call as gelu_tanh times it).
bool gelu_tanh_runs_ours(const at::Tensor& x);
// `act` applied to x: what an MLP's hidden layer and a head's transform compute.
at::Tensor activate(Act act, const at::Tensor& x);

}  // namespace colossal::nn
