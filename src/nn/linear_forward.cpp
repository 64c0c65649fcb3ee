// Dense linear forward with the decoding GEMV: see linear_forward.h.
#include "src/nn/linear_forward.h"

#include <ATen/ATen.h>

#include "kernels/cpu/gemv.h"
#include "src/nn/kernel_choice.h"

namespace colossal::nn {
namespace {

bool decoding_shape(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  const bool records_grad =
      at::GradMode::is_enabled() && (x.requires_grad() || w.requires_grad() || (b.defined() && b.requires_grad()));
  return !records_grad && x.is_cpu() && w.is_cpu() && x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat &&
         (!b.defined() || (b.scalar_type() == at::kFloat && b.is_contiguous())) && x.dim() >= 2 && x.size(-2) == 1 &&
         x.size(-1) == w.size(1) && x.numel() / x.size(-1) <= kGemvMaxRows && w.is_contiguous();
}

at::Tensor gemv(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  const int64_t in = w.size(1), out = w.size(0);
  auto xc = x.contiguous();
  auto sizes = x.sizes().vec();
  sizes.back() = out;
  auto y = at::empty(sizes, x.options());
  kernels::gemv(xc.const_data_ptr<float>(), xc.numel() / in, in, w.const_data_ptr<float>(),
                b.defined() ? b.const_data_ptr<float>() : nullptr, y.mutable_data_ptr<float>(), out);
  return y;
}

}  // namespace

at::Tensor linear_forward(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  if (decoding_shape(x, weight, bias)) {
    const std::string shape = "in=" + std::to_string(weight.size(1)) + " out=" + std::to_string(weight.size(0));
    if (use_ours("gemv", kernel_policy().gemv, shape, [&] { gemv(x, weight, bias); },
                 [&] { at::linear(x, weight, bias); }))
      return gemv(x, weight, bias);
  }
  return at::linear(x, weight, bias);
}

}  // namespace colossal::nn
