// Activations: see activation.h.
#include "src/nn/activation.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include "kernels/cpu/gelu.h"
#include "src/nn/kernel_choice.h"

namespace colossal::nn {
namespace {

// Under autograd, saves the local derivative (written by the forward's own pass) where ATen's
// GeluBackward saves the input: the same bytes, and the backward is one multiply, no tanh.
struct GeluTanh : public torch::autograd::Function<GeluTanh> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x) {   // x requires grad (ours)
    auto xc = x.contiguous();
    auto y = at::empty_like(xc);
    auto dydx = at::empty_like(xc);
    kernels::gelu_tanh_forward_with_grad(xc.const_data_ptr<float>(), y.mutable_data_ptr<float>(),
                                         dydx.mutable_data_ptr<float>(), xc.numel());
    ctx->save_for_backward({dydx});
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    return {grad_out[0] * ctx->get_saved_variables()[0]};
  }
};

// Ours through autograd where a gradient is recorded, else the kernel alone (Function::apply builds a
// node even under no_grad: microseconds a decoding step pays once a block).
at::Tensor ours(const at::Tensor& x) {
  if (at::GradMode::is_enabled() && x.requires_grad()) return GeluTanh::apply(x);
  auto xc = x.contiguous();
  auto y = at::empty_like(xc);
  kernels::gelu_tanh_forward(xc.const_data_ptr<float>(), y.mutable_data_ptr<float>(), xc.numel());
  return y;
}

// The kernel choice's shape for n elements.
std::string choice_shape(int64_t n, bool grad) { return "n=" + std::to_string(n) + (grad ? " fwd+bwd" : " fwd"); }

// Whether our kernel runs for x's size (kernel_choice.h), timed on a detached copy of x.
bool fused_gelu_chosen(const at::Tensor& x) {
  const bool grad = at::GradMode::is_enabled();
  const std::string shape = choice_shape(x.numel(), grad);
  if (auto d = decided_ours("gelu", kernel_policy().gelu, shape)) return *d;
  const at::Tensor input = x.detach().clone().requires_grad_(grad);
  const at::Tensor dy = at::ones_like(input);
  auto run = [&](bool use_ours) {
    auto y = use_ours ? ours(input) : at::gelu(input, "tanh");
    if (grad) torch::autograd::grad({y}, {input}, {dy});
  };
  return time_and_choose("gelu", shape, [&] { run(true); }, [&] { run(false); });
}

}  // namespace

bool gelu_tanh_runs_ours(const at::Tensor& x) { return x.is_cpu() && x.scalar_type() == at::kFloat && fused_gelu_chosen(x); }

at::Tensor gelu_tanh(const at::Tensor& x) {
  if (gelu_tanh_runs_ours(x)) return ours(x);
  return at::gelu(x, "tanh");
}

at::Tensor activate(Act act, const at::Tensor& x) {
  switch (act) {
    case Act::GeluTanh: return gelu_tanh(x);
    case Act::Gelu: return at::gelu(x);
    case Act::Relu: return at::relu(x);
  }
  TORCH_CHECK(false, "unknown activation");
}

}  // namespace colossal::nn
