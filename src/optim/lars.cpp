// LARS: see lars.h.
#include "src/optim/lars.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <cmath>

namespace colossal::optim {

void Lars::update(std::vector<ParamPiece>& pieces, const StepContext& ctx) {
  at::NoGradGuard no_grad;
  const at::Tensor sq = squared_norms(pieces, ctx, {[&](size_t i) { return pieces[i].param; }, [&](size_t i) { return pieces[i].grad; }});
  const double *w2 = sq[0].data_ptr<double>(), *g2 = sq[1].data_ptr<double>();
  for (auto& p : pieces) {
    const int64_t t = p.tensor;
    const double wn = std::sqrt(w2[t]), gn = std::sqrt(g2[t]);
    const bool adapt = p.weight_decay != 0;
    const double local = adapt && wn > 0 && gn > 0 ? opt_.trust_coefficient * wn / (gn + p.weight_decay * wn + opt_.eps) : 1.0;
    at::Tensor d = p.weight_decay != 0 ? p.grad.add(p.param, p.weight_decay) : p.grad;
    p.state[0].mul_(opt_.momentum).add_(d, ctx.lr * local);
    p.param.sub_(p.state[0]);
  }
}

}  // namespace colossal::optim
