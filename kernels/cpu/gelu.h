// GELU with the tanh approximation (GPT-2's activation), forward and backward over raw float arrays:
//   y = x/2 (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
// The backward recomputes tanh from x (as ATen's does, so nothing extra is stored). Both are one
// vectorised pass with vec_math.h's tanh, which costs about half of the SLEEF tanh ATen calls.
#pragma once
#include <cstdint>

namespace colossal::kernels {

void gelu_tanh_forward(const float* x, float* y, int64_t n);
// dx = dy * dy/dx(x); dx may alias dy.
void gelu_tanh_backward(const float* x, const float* dy, float* dx, int64_t n);

}  // namespace colossal::kernels
