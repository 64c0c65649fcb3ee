// Dense linear forward with the decoding GEMV: see linear_forward.h.
#include "src/nn/linear_forward.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/custom_function.h>

#include "kernels/cpu/cache_evict.h"
#include "kernels/cpu/gelu.h"
#include "kernels/cpu/gemv.h"
#include "src/nn/activation.h"
#include "src/nn/gemm_choice.h"
#include "src/nn/kernel_choice.h"
#include "src/nn/recompute.h"

namespace colossal::nn {
namespace {

thread_local DeferredWeightGrads* t_deferred = nullptr;

bool records_grad(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  return at::GradMode::is_enabled() && (x.requires_grad() || w.requires_grad() || (b.defined() && b.requires_grad()));
}

// A decoding step's operands for a GEMV: W [out, in] either contiguous or the transposed view of a
// contiguous [in, out] (a weight viewed in place where the file holds W^T), and x [..., 1, in].
bool decoding_weight(const at::Tensor& w, const at::Tensor& b) {
  return w.is_cpu() && w.scalar_type() == at::kFloat && (!b.defined() || (b.scalar_type() == at::kFloat && b.is_contiguous())) &&
         w.dim() == 2 && (w.is_contiguous() || w.t().is_contiguous());
}
bool decoding_shape(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  return !records_grad(x, w, b) && x.is_cpu() && x.scalar_type() == at::kFloat && decoding_weight(w, b) && x.dim() >= 2 &&
         x.size(-2) == 1 && x.size(-1) == w.size(1) && x.numel() / x.size(-1) <= kGemvMaxRows;
}

// The decoding GEMV's kernel_choice.h shape: the weight's, whatever the rows.
std::string gemv_shape(const at::Tensor& w) {
  return "in=" + std::to_string(w.size(1)) + " out=" + std::to_string(w.size(0)) + (w.is_contiguous() ? "" : " transposed");
}

at::Tensor gemv(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  const int64_t in = w.size(1), out = w.size(0);
  auto xc = x.contiguous();
  auto sizes = x.sizes().vec();
  sizes.back() = out;
  auto y = at::empty(sizes, x.options());
  const float* bias = b.defined() ? b.const_data_ptr<float>() : nullptr;
  if (w.is_contiguous())
    kernels::gemv(xc.const_data_ptr<float>(), xc.numel() / in, in, w.const_data_ptr<float>(), bias, y.mutable_data_ptr<float>(), out);
  else   // W^T lies contiguous: MKL's GEMM at these few rows ran on one core
    kernels::gemv_t(xc.const_data_ptr<float>(), xc.numel() / in, in, w.const_data_ptr<float>(), bias, y.mutable_data_ptr<float>(), out);
  return y;
}

// A backward's weight gradient dy^T x: queued where a zero-bubble schedule defers it (summed into
// .grad as autograd would have), else returned (undefined where it went into the .grad buffer).
at::Tensor weight_grad(const at::Tensor& weight, const at::Tensor& dy, const at::Tensor& x) {
  if (!t_deferred) return gemm_weight_grad_for(weight, dy, x);
  t_deferred->add([weight, dy, x] {
    at::NoGradGuard no_grad;
    const at::Tensor g = gemm_weight_grad_for(weight, dy, x);
    if (!g.defined()) return;
    at::Tensor& held = const_cast<at::Tensor&>(weight).mutable_grad();
    held = held.defined() ? held.add_(g) : g;
  });
  return {};
}

// The forward's side of both nodes below: saves the product's input (or what it is computed from) and
// the weight, and whether a bias came (an absent one arrives empty: see linear_forward); returns the
// bias, or undefined.
at::Tensor save_operands(torch::autograd::AutogradContext* ctx, const at::Tensor& saved, const at::Tensor& weight,
                         const at::Tensor& bias) {
  ctx->save_for_backward({saved, weight});
  const bool has_bias = bias.numel() > 0;
  ctx->saved_data["bias"] = has_bias;
  return has_bias ? bias : at::Tensor();
}

at::Tensor bias_grad(torch::autograd::AutogradContext* ctx, const at::Tensor& dy) {
  return ctx->saved_data["bias"].toBool() && ctx->needs_input_grad(2) ? dy.sum(0) : at::Tensor();
}

// y = x W^T + b for a training step on CPU: the forward and both gradients go through gemm_choice.h
// (our GEMM or ATen's per form and shape), the weight's gradient into its .grad buffer when there is
// one (grad_buffer_of).
struct DenseLinearFunction : public torch::autograd::Function<DenseLinearFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias) {
    return gemm_linear(x, weight, save_operands(ctx, x, weight, bias));
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1];
    const at::Tensor dy = grad_out[0].contiguous();
    at::Tensor dx, dw;
    if (ctx->needs_input_grad(0)) dx = gemm_input_grad(dy, weight);
    if (ctx->needs_input_grad(1)) dw = weight_grad(weight, dy, x);
    return {dx, dw, bias_grad(ctx, dy)};
  }
};

// y = gelu_tanh(h) W^T + b for a training step on CPU with our GELU: saves h, not the GELU's output and
// derivative, and computes both again in backward with the kernel the forward's GELU node would have
// run (linear_forward.h). The products as DenseLinearFunction's.
struct GeluDenseLinearFunction : public torch::autograd::Function<GeluDenseLinearFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& h, const at::Tensor& weight,
                            const at::Tensor& bias) {
    const at::Tensor b = save_operands(ctx, h, weight, bias);
    auto g = at::empty_like(h);
    kernels::gelu_tanh_forward(h.const_data_ptr<float>(), g.mutable_data_ptr<float>(), h.numel());
    return gemm_linear(g, weight, b);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor &h = saved[0], &weight = saved[1];
    const at::Tensor dy = grad_out[0].contiguous();
    // g for the weight's gradient; its derivative only where h's gradient is asked for (one pass either way)
    auto g = at::empty_like(h);
    at::Tensor dh, dw, dgdh;
    if (ctx->needs_input_grad(0)) {
      dgdh = at::empty_like(h);
      kernels::gelu_tanh_forward_with_grad(h.const_data_ptr<float>(), g.mutable_data_ptr<float>(), dgdh.mutable_data_ptr<float>(),
                                           h.numel());
      dh = gemm_input_grad(dy, weight).mul_(dgdh);   // GeluTanh's backward: dg * dgdh
    } else {
      kernels::gelu_tanh_forward(h.const_data_ptr<float>(), g.mutable_data_ptr<float>(), h.numel());
    }
    if (ctx->needs_input_grad(1)) dw = weight_grad(weight, dy, g);
    return {dh, dw, bias_grad(ctx, dy)};
  }
};

// Operands kernels/cpu/gemm takes (gemm_choice.h times it against ATen per shape), where the policy lets it.
bool gemm_operands(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, KernelPath policy) {
  return policy != KernelPath::Aten && gemm_applies(x, w) && x.dim() >= 2 && x.size(-1) == w.size(1) &&
         x.numel() > 0 && (!b.defined() || (b.is_cpu() && b.scalar_type() == at::kFloat && b.is_contiguous()));
}

}  // namespace

std::optional<bool> gemv_decision(const at::Tensor& weight, const at::Tensor& bias) {
  if (!decoding_weight(weight, bias)) return false;
  return decided_ours("gemv", kernel_policy().gemv, gemv_shape(weight));
}

bool gemv_takes(const at::Tensor& weight, const at::Tensor& bias) { return decoding_weight(weight, bias); }

void DeferredWeightGrads::run() {
  for (auto& w : work_) w();
  work_.clear();
}

void defer_weight_grads(DeferredWeightGrads* queue) { t_deferred = queue; }

at::Tensor linear_forward_after_gelu_tanh(const at::Tensor& h, const at::Tensor& weight, const at::Tensor& bias) {
  if (!records_grad(h, weight, bias) || rerunning_for_backward() || !gemm_operands(h, weight, bias, kernel_policy().gemm) ||
      !gelu_tanh_runs_ours(h))
    return linear_forward(gelu_tanh(h), weight, bias);
  auto sizes = h.sizes().vec();
  sizes.back() = weight.size(0);
  const at::Tensor b = bias.defined() ? bias : at::empty({0}, weight.options());
  return GeluDenseLinearFunction::apply(h.reshape({-1, h.size(-1)}).contiguous(), weight, b).view(sizes);
}

at::Tensor linear_forward(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  if (decoding_shape(x, weight, bias)) {
    // Timed with the weight out of the caches before every call, as a decoding step reads it: warm in
    // L2, MKL's sgemm took the 768 x 768 layer at eight sequences from our GEMV by a few percent, and
    // with it the fused decoding block (kernels/cpu/decode_block.h) from every layer.
    if (use_ours("gemv", kernel_policy().gemv, gemv_shape(weight), [&] { gemv(x, weight, bias); },
                 [&] { at::linear(x, weight, bias); }, [&] { kernels::evict_from_caches(weight.const_data_ptr(), weight.nbytes()); }))
      return gemv(x, weight, bias);
  }
  const bool inference = !records_grad(x, weight, bias);   // a prefill, or a server's step of many tokens
  if (!gemm_operands(x, weight, bias, inference ? kernel_policy().inference_gemm : kernel_policy().gemm))
    return at::linear(x, weight, bias);
  auto sizes = x.sizes().vec();
  sizes.back() = weight.size(0);
  auto x2 = x.reshape({-1, x.size(-1)}).contiguous();
  if (inference) return gemm_linear_inference(x2, weight, bias).view(sizes);
  // Function::apply records every input's device, so an absent bias travels as an empty tensor.
  const at::Tensor b = bias.defined() ? bias : at::empty({0}, weight.options());
  return DenseLinearFunction::apply(x2, weight, b).view(sizes);
}

}  // namespace colossal::nn
