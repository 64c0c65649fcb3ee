// GELU with the tanh approximation (GPT-2's activation), forward and backward over raw float arrays:
//   y = x/2 (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
// Under autograd the forward also writes the local derivative dy/dx, which the backward saves in
// place of x (the same bytes: nothing else keeps the GELU's input), so the backward is one multiply
// instead of recomputing tanh. Each is one vectorised pass with vec_math.h's tanh, which costs about
// half of the SLEEF tanh ATen calls.
#pragma once
#include <cstdint>

namespace colossal::kernels {

void gelu_tanh_forward(const float* x, float* y, int64_t n);
// y as above and dydx = d gelu(x) / dx (the backward's dx is then dy * dydx).
void gelu_tanh_forward_with_grad(const float* x, float* y, float* dydx, int64_t n);

}  // namespace colossal::kernels
