// AdamW: see adamw.h.
#include "src/optim/adamw.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <cmath>

#include "kernels/cpu/adamw.h"

namespace colossal::optim {

AdamW::AdamW(FlatParams& params, const AdamWOptions& options) : params_(params), opt_(options) {
  for (auto& g : params_.groups()) {
    exp_avg_.push_back(at::zeros_like(g.params));
    exp_avg_sq_.push_back(at::zeros_like(g.params));
    if (g.params.is_cuda()) device_steps_.push_back(at::zeros({}, g.params.options().dtype(at::kFloat)));
  }
}

void AdamW::step(double lr) {
  ++step_;
  auto& groups = params_.groups();
  for (size_t i = 0; i < groups.size(); ++i) {
    auto& g = groups[i];
    const kernels::AdamWHyper h{lr, opt_.beta1, opt_.beta2, opt_.eps, g.weight_decay, step_};
    at::Tensor &p = g.params, &grad = g.grads, &m = exp_avg_[i], &v = exp_avg_sq_[i];
    if (p.is_cpu() && p.scalar_type() == at::kFloat) {
      kernels::adamw_step(p.data_ptr<float>(), grad.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(),
                          p.numel(), h);
    } else if (p.is_cpu() && p.scalar_type() == at::kDouble) {
      kernels::adamw_step(p.data_ptr<double>(), grad.data_ptr<double>(), m.data_ptr<double>(),
                          v.data_ptr<double>(), p.numel(), h);
    } else if (p.is_cuda()) {
      // ATen's fused multi-tensor AdamW: the same update (decay, moments, bias corrections, eps
      // outside the root) in one kernel per group. It reads the step count from a device tensor, so
      // the host never waits on the GPU here.
      device_steps_[i].fill_(static_cast<double>(step_));
      at::_fused_adamw_({p}, {grad}, {m}, {v}, {}, {device_steps_[i]}, lr, opt_.beta1, opt_.beta2, g.weight_decay, opt_.eps,
                        /*amsgrad=*/false, /*maximize=*/false);
    } else {
      // Same arithmetic as the fused kernel, as tensor ops (other devices).
      at::NoGradGuard no_grad;
      const double bc1 = 1 - std::pow(opt_.beta1, static_cast<double>(step_));
      const double bc2 = 1 - std::pow(opt_.beta2, static_cast<double>(step_));
      p.mul_(1 - lr * g.weight_decay);
      m.lerp_(grad, 1 - opt_.beta1);
      v.mul_(opt_.beta2).addcmul_(grad, grad, 1 - opt_.beta2);
      auto denom = (v.sqrt() / std::sqrt(bc2)).add_(opt_.eps);
      p.addcdiv_(m, denom, -lr / bc1);
    }
  }
}

}  // namespace colossal::optim
