// LayerNorm: see layer_norm.h.
#include "src/nn/layer_norm.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <typeinfo>

#include "kernels/cpu/layer_norm.h"
#include "src/nn/kernel_choice.h"

namespace colossal::nn {
namespace {

// The kernel's forward: y, and [mean; rstd] per row into `stats` [2, rows].
at::Tensor forward_values(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, double eps, at::Tensor& stats) {
  const int64_t cols = x.size(-1), rows = x.numel() / cols;
  auto y = at::empty_like(x);
  stats = at::empty({2, rows}, x.options());
  kernels::layer_norm_forward(x.const_data_ptr<float>(), w.const_data_ptr<float>(), b.const_data_ptr<float>(),
                              y.mutable_data_ptr<float>(), stats.mutable_data_ptr<float>(), stats.mutable_data_ptr<float>() + rows,
                              rows, cols, static_cast<float>(eps));
  return y;
}

// Saves x, mean and rstd (as ATen's NativeLayerNormBackward does) and the weight.
struct FusedLayerNorm : public torch::autograd::Function<FusedLayerNorm> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x_in, const at::Tensor& weight,
                            const at::Tensor& bias, double eps) {
    auto x = x_in.contiguous(), w = weight.contiguous(), b = bias.contiguous();
    at::Tensor stats;
    auto y = forward_values(x, w, b, eps, stats);
    ctx->save_for_backward({x, w, stats});
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w = saved[1], &stats = saved[2];
    const int64_t cols = x.size(-1), rows = x.numel() / cols;
    auto dy = grad_out[0].contiguous();
    auto dx = at::empty_like(x), dw = at::empty_like(w), db = at::empty_like(w);
    kernels::layer_norm_backward(dy.const_data_ptr<float>(), x.const_data_ptr<float>(), stats.const_data_ptr<float>(),
                                 stats.const_data_ptr<float>() + rows, w.const_data_ptr<float>(),
                                 dx.mutable_data_ptr<float>(), dw.mutable_data_ptr<float>(),
                                 db.mutable_data_ptr<float>(), rows, cols);
    return {dx, dw, db, at::Tensor()};
  }
};

// Ours through autograd where a gradient is recorded, else the kernel alone: Function::apply builds a
// node and saves x, the weight and the statistics even under no_grad, microseconds that a decoding step
// pays twice a block.
at::Tensor ours(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, double eps) {
  if (at::GradMode::is_enabled() && (x.requires_grad() || w.requires_grad() || b.requires_grad())) return FusedLayerNorm::apply(x, w, b, eps);
  at::Tensor stats;
  return forward_values(x.contiguous(), w.contiguous(), b.contiguous(), eps, stats);
}

bool all_cpu_float(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  for (const auto* t : {&x, &w, &b})
    if (!t->defined() || !t->is_cpu() || t->scalar_type() != at::kFloat) return false;
  return x.numel() > 0;
}

// The kernel choice's shape for rows x cols.
std::string choice_shape(int64_t rows, int64_t cols, bool grad) {
  return "rows=" + std::to_string(rows) + " cols=" + std::to_string(cols) + (grad ? " fwd+bwd" : " fwd");
}

// Whether ours runs at x's shape (kernel_choice.h), timed on detached copies of x and the parameters.
bool fused_layer_norm_chosen(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, double eps) {
  const bool grad = at::GradMode::is_enabled() && (x.requires_grad() || w.requires_grad() || b.requires_grad());
  const int64_t cols = x.size(-1);
  const std::string shape = choice_shape(x.numel() / cols, cols, grad);
  if (auto d = decided_ours("layer_norm", kernel_policy().layer_norm, shape)) return *d;
  const at::Tensor xi = x.detach().clone().requires_grad_(grad), wi = w.detach().clone().requires_grad_(grad),
                   bi = b.detach().clone().requires_grad_(grad);
  const at::Tensor dy = at::ones_like(xi);
  auto run = [&](bool use_ours) {
    auto y = use_ours ? ours(xi, wi, bi, eps) : aten_layer_norm(xi, wi, bi, eps);
    if (grad) torch::autograd::grad({y}, {xi, wi, bi}, {dy});
  };
  return time_and_choose("layer_norm", shape, [&] { run(true); }, [&] { run(false); });
}

}  // namespace

at::Tensor fused_layer_norm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, double eps) {
  TORCH_CHECK(all_cpu_float(x, weight, bias) && weight.numel() == x.size(-1) && bias.numel() == x.size(-1),
              "fused_layer_norm: needs CPU float x [..., C] and weight, bias [C]; got ", x.sizes(), ", ",
              weight.sizes(), ", ", bias.sizes());
  return ours(x, weight, bias, eps);
}

at::Tensor aten_layer_norm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, double eps) {
  return at::layer_norm(x, {x.size(-1)}, weight, bias, eps);
}

LayerNorm::LayerNorm(int64_t dim, double eps, const LayerFactory& f) : LayerNorm(dim, eps, f, ShardSpec{}) {}

LayerNorm::LayerNorm(int64_t local, double eps, const LayerFactory& f, const ShardSpec& shard) : dim_(local), eps_(eps) {
  weight = register_parameter("weight", f.parameter({local}), true, shard);
  bias = register_parameter("bias", f.parameter({local}), true, shard);
}

at::Tensor LayerNorm::forward(const at::Tensor& x) { return normalise(x, weight, bias); }

bool LayerNorm::kernel_params(int64_t rows, const float*& gamma, const float*& beta, float& eps) const {
  if (typeid(*this) != typeid(LayerNorm) || at::GradMode::is_enabled() || rows < 1) return false;
  for (const auto* t : {&weight, &bias})
    if (!t->defined() || !t->is_cpu() || t->scalar_type() != at::kFloat || !t->is_contiguous() || t->numel() != dim_) return false;
  // Not the first-use timing of the op alone (a tie of a microsecond at a decoding step's rows, which
  // went ATen's way in 5 of 16 runs' kept choices here and then turned the whole fused block off, 1.2x
  // slower at 8 sequences): only a policy forcing ATen's.
  if (!kernel_choice_.get(rows, [] { return std::optional<bool>(kernel_policy().layer_norm != KernelPath::Aten); })) return false;
  gamma = weight.const_data_ptr<float>();
  beta = bias.const_data_ptr<float>();
  eps = static_cast<float>(eps_);
  return true;
}

at::Tensor LayerNorm::normalise(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) == dim_, "LayerNorm over ", dim_, " features got input ", x.sizes());
  if (all_cpu_float(x, w, b) && fused_layer_norm_chosen(x, w, b, eps_)) return ours(x, w, b, eps_);   // shapes checked above
  return aten_layer_norm(x, w, b, eps_);
}

}  // namespace colossal::nn
