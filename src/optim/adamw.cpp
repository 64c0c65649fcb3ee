// AdamW: see adamw.h.
#include "src/optim/adamw.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <cmath>

#include "kernels/cpu/adamw.h"

namespace colossal::optim {

void AdamW::update(std::vector<ParamPiece>& pieces, const StepContext& ctx) {
  const double lr = ctx.lr;
  for (auto& piece : pieces) {
    at::Tensor &p = piece.param, &grad = piece.grad, &m = piece.state[0], &v = piece.state[1];
    const kernels::AdamWHyper h{lr, opt_.beta1, opt_.beta2, opt_.eps, piece.weight_decay, step_, ctx.grad_scale};
    if (p.is_cpu() && p.scalar_type() == at::kFloat) {
      kernels::adamw_step(p.data_ptr<float>(), grad.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(), p.numel(), h);
    } else if (p.is_cpu() && p.scalar_type() == at::kDouble) {
      kernels::adamw_step(p.data_ptr<double>(), grad.data_ptr<double>(), m.data_ptr<double>(), v.data_ptr<double>(), p.numel(), h);
    } else if (p.is_cuda()) {
      if (ctx.grad_scale != 1) grad.mul_(ctx.grad_scale);
      // ATen's fused multi-tensor AdamW: the same update (decay, moments, bias corrections, eps outside
      // the root). It reads the step count from a device tensor, so the host never waits on the GPU.
      if (!device_step_.defined()) device_step_ = at::zeros({}, p.options().dtype(at::kFloat));
      device_step_.fill_(static_cast<double>(step_));
      at::_fused_adamw_({p}, {grad}, {m}, {v}, {}, {device_step_}, lr, opt_.beta1, opt_.beta2, piece.weight_decay, opt_.eps,
                        /*amsgrad=*/false, /*maximize=*/false);
    } else {
      // Same arithmetic as the fused kernel, as tensor ops (other devices).
      at::NoGradGuard no_grad;
      if (ctx.grad_scale != 1) grad.mul_(ctx.grad_scale);
      const double bc1 = 1 - std::pow(opt_.beta1, static_cast<double>(step_));
      const double bc2 = 1 - std::pow(opt_.beta2, static_cast<double>(step_));
      p.mul_(1 - lr * piece.weight_decay);
      m.lerp_(grad, 1 - opt_.beta1);
      v.mul_(opt_.beta2).addcmul_(grad, grad, 1 - opt_.beta2);
      auto denom = (v.sqrt() / std::sqrt(bc2)).add_(opt_.eps);
      p.addcdiv_(m, denom, -lr / bc1);
    }
  }
}

}  // namespace colossal::optim
