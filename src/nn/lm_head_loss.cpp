// Fused LM head + cross entropy: see lm_head_loss.h.
#include "src/nn/lm_head_loss.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "kernels/cpu/cross_entropy.h"

namespace colossal::nn {
namespace {

struct LmHeadCrossEntropy : public torch::autograd::Function<LmHeadCrossEntropy> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& targets) {
    at::Tensor logits = at::mm(x, weight.t());                  // [N, V]; becomes d(loss)/d(logits)
    const int64_t n = logits.size(0), v = logits.size(1);
    const int64_t counted = targets.ge(0).sum().item<int64_t>();
    const double grad_scale = counted > 0 ? 1.0 / static_cast<double>(counted) : 0.0;
    at::Tensor loss;
    if (logits.is_cpu() && logits.scalar_type() == at::kFloat) {
      auto t = targets.contiguous();
      auto losses = at::empty({n}, logits.options());
      kernels::softmax_cross_entropy_inplace(logits.data_ptr<float>(), t.data_ptr<int64_t>(), losses.data_ptr<float>(), n,
                                             v, static_cast<float>(grad_scale));
      loss = losses.sum() * grad_scale;
    } else {
      // Other devices and dtypes: the same quantities from ATen ops.
      auto valid = targets.ge(0);
      auto safe = targets.clamp_min(0);
      auto lse = at::logsumexp(logits, 1);
      auto picked = logits.gather(1, safe.unsqueeze(1)).squeeze(1);
      loss = ((lse - picked) * valid).sum() * grad_scale;
      auto grad = (logits - lse.unsqueeze(1)).exp_();
      grad.scatter_add_(1, safe.unsqueeze(1), -valid.to(grad.scalar_type()).unsqueeze(1));
      logits = grad.mul_(valid.unsqueeze(1)).mul_(grad_scale);
    }
    ctx->save_for_backward({x, weight, logits});
    return loss;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1];
    at::Tensor dlogits = saved[2];                              // [N, V], already scaled by 1/N
    const at::Tensor& g = grad_out[0];
    // Backward runs once per graph, so the saved buffer can be scaled in place (e.g. by 1/grad_accum).
    if (!(g.numel() == 1 && g.item<double>() == 1.0)) dlogits.mul_(g);
    return {at::mm(dlogits, weight), at::mm(dlogits.t(), x), at::Tensor()};
  }
};

}  // namespace

at::Tensor lm_head_cross_entropy(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& targets) {
  return LmHeadCrossEntropy::apply(x, weight, targets);
}

}  // namespace colossal::nn
