// Lion: see lion.h.
#include "src/optim/lion.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

namespace colossal::optim {

void Lion::update(std::vector<ParamPiece>& pieces, const StepContext& ctx) {
  at::NoGradGuard no_grad;
  for (auto& p : pieces) {
    at::Tensor& m = p.state[0];
    const at::Tensor c = m.lerp(p.grad, 1 - opt_.beta1);
    p.param.mul_(1 - ctx.lr * p.weight_decay).add_(c.sign(), -ctx.lr);
    m.lerp_(p.grad, 1 - opt_.beta2);
  }
}

}  // namespace colossal::optim
