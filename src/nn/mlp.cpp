// MLP: see mlp.h.
#include "src/nn/mlp.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "src/nn/activation.h"

namespace colossal::nn {

Mlp::Mlp(const MlpSpec& spec, LayerFactory& factory) : spec_(spec), cut_(factory.stream_cut()) {
  fc_ = register_module("fc", factory.linear({.in = spec.width, .out = spec.hidden, .bias = spec.bias, .split = Split::Column}));
  proj_ = register_module("proj", factory.linear({.in = spec.hidden, .out = spec.width, .bias = spec.bias, .split = Split::Row}));
}

at::Tensor Mlp::forward(const at::Tensor& x) {
  const at::Tensor h = fc_->forward(x);   // [B, T, hidden]
  auto y = spec_.act == Act::GeluTanh ? proj_->forward_after_gelu_tanh(h) : proj_->forward(activate(spec_.act, h));
  const double p = is_training() ? spec_.dropout : 0.0;
  return p > 0 ? cut_->dropout(y, p) : y;
}

bool Mlp::decode_parts(int64_t rows, DecodeParts& parts) {
  if (is_training()) return false;
  if (spec_.act == Act::GeluTanh) {
    const int64_t n = rows * spec_.hidden;
    // the policy, not the op's own timing (as LayerNorm::kernel_params)
    if (at::GradMode::is_enabled() || !gelu_choice_.get(n, [] { return std::optional<bool>(kernel_policy().gelu != KernelPath::Aten); }))
      return false;
    parts.act = kernels::DecodeActivation::gelu_tanh;
  } else if (spec_.act == Act::Relu) {
    parts.act = kernels::DecodeActivation::relu;
  } else {
    return false;
  }
  auto fc = fc_->decode_product(rows), proj = proj_->decode_product(rows);
  if (!fc || !proj || fc->in != spec_.width || fc->out != spec_.hidden || proj->in != spec_.hidden || proj->out != spec_.width)
    return false;
  parts.fc = *fc;
  parts.proj = *proj;
  return true;
}

}  // namespace colossal::nn
