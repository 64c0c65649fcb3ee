// Activations: see activation.h.
#include "src/nn/activation.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "kernels/cpu/gelu.h"

namespace colossal::nn {
namespace {

// Saves its input, as ATen's GeluBackward does, and recomputes tanh in backward.
struct GeluTanh : public torch::autograd::Function<GeluTanh> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x) {
    auto xc = x.contiguous();
    auto y = at::empty_like(xc);
    kernels::gelu_tanh_forward(xc.const_data_ptr<float>(), y.mutable_data_ptr<float>(), xc.numel());
    ctx->save_for_backward({xc});
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    const at::Tensor x = ctx->get_saved_variables()[0];
    auto dy = grad_out[0].contiguous();
    auto dx = at::empty_like(x);
    kernels::gelu_tanh_backward(x.const_data_ptr<float>(), dy.const_data_ptr<float>(), dx.mutable_data_ptr<float>(),
                                x.numel());
    return {dx};
  }
};

}  // namespace

at::Tensor gelu_tanh(const at::Tensor& x) {
  if (x.is_cpu() && x.scalar_type() == at::kFloat) return GeluTanh::apply(x);
  return at::gelu(x, "tanh");
}

}  // namespace colossal::nn
