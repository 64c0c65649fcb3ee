// SGD with momentum: see sgd.h.
#include "src/optim/sgd.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

namespace colossal::optim {

void Sgd::update(std::vector<ParamPiece>& pieces, const StepContext& ctx) {
  at::NoGradGuard no_grad;
  for (auto& p : pieces) {
    const at::Tensor d = p.weight_decay != 0 ? p.grad.add(p.param, p.weight_decay) : p.grad;
    if (opt_.momentum == 0) {
      p.param.sub_(d, ctx.lr);
      continue;
    }
    at::Tensor& b = p.state[0];
    b.mul_(opt_.momentum).add_(d);   // zeros at the start: the first step leaves b = d, as torch does
    if (opt_.nesterov) p.param.sub_(d.add(b, opt_.momentum), ctx.lr);
    else p.param.sub_(b, ctx.lr);
  }
}

}  // namespace colossal::optim
