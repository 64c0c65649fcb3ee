// LAMB: see lamb.h.
#include "src/optim/lamb.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <cmath>

namespace colossal::optim {

void Lamb::update(std::vector<ParamPiece>& pieces, const StepContext& ctx) {
  at::NoGradGuard no_grad;
  const double bc1 = 1 - std::pow(opt_.beta1, static_cast<double>(step_));
  const double bc2 = 1 - std::pow(opt_.beta2, static_cast<double>(step_));
  // The update direction of each piece, kept until the trust ratios (which need every shard) are known.
  std::vector<at::Tensor> r;
  for (auto& p : pieces) {
    at::Tensor &m = p.state[0], &v = p.state[1];
    m.lerp_(p.grad, 1 - opt_.beta1);
    v.mul_(opt_.beta2).addcmul_(p.grad, p.grad, 1 - opt_.beta2);
    at::Tensor u = (m / bc1).div_((v / bc2).sqrt_().add_(opt_.eps));
    if (p.weight_decay != 0) u.add_(p.param, p.weight_decay);
    r.push_back(u);
  }
  const at::Tensor sq = squared_norms(pieces, ctx, {[&](size_t i) { return pieces[i].param; }, [&](size_t i) { return r[i]; }});
  const double *w2 = sq[0].data_ptr<double>(), *r2 = sq[1].data_ptr<double>();
  for (size_t i = 0; i < pieces.size(); ++i) {
    const int64_t t = pieces[i].tensor;
    const double wn = std::sqrt(w2[t]), rn = std::sqrt(r2[t]);
    const bool adapt = pieces[i].weight_decay != 0;
    const double phi = adapt && wn > 0 && rn > 0 ? wn / rn : 1.0;
    pieces[i].param.add_(r[i], -ctx.lr * phi);
  }
}

}  // namespace colossal::optim
