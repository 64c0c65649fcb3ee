// Vocabulary-parallel LM head + cross entropy: see vocab_cross_entropy.h.
#include "src/parallel/vocab_cross_entropy.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "src/dist/group.h"
#include "src/nn/embedding_lookup.h"

namespace colossal::parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct VocabParallelCrossEntropy : public torch::autograd::Function<VocabParallelCrossEntropy> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& targets,
                            int64_t first, dist::Group* g) {
    const int64_t local = weight.size(0);
    at::Tensor logits = at::mm(x, weight.t()).to(at::kFloat);                    // [N, V/P]; becomes d(loss)/d(logits)
    at::Tensor max = std::get<0>(logits.max(1)).contiguous();                   // [N]
    g->all_reduce(max, dist::Reduce::max, "vocabulary-parallel max logit");
    logits.sub_(max.unsqueeze(1));
    const at::Tensor mine = targets.ge(first).logical_and(targets.lt(first + local));
    const at::Tensor row_of_target = (targets - first).clamp(0, local - 1);
    const at::Tensor picked = logits.gather(1, row_of_target.unsqueeze(1)).squeeze(1) * mine;   // the target's shifted logit
    logits.exp_();   // once, in place: the normaliser's terms now, the softmax after the division below
    // [2, N]: the softmax's normaliser and the target's logit, summed over the ranks at once
    at::Tensor sums = at::stack({logits.sum(1), picked});
    g->all_reduce(sums, dist::Reduce::sum, "vocabulary-parallel softmax sums");
    const at::Tensor valid = targets.ge(0);
    const double counted = static_cast<double>(valid.sum().item<int64_t>());
    const double scale = counted > 0 ? 1.0 / counted : 0.0;
    const at::Tensor loss = ((sums[0].log() - sums[1]) * valid).sum() * scale;
    // d(loss)/d(logits) = (softmax - one_hot(target)) * valid / counted
    logits.div_(sums[0].unsqueeze(1));
    logits.scatter_add_(1, row_of_target.unsqueeze(1), -(mine.logical_and(valid)).to(logits.scalar_type()).unsqueeze(1));
    logits.mul_((valid.to(logits.scalar_type()) * scale).unsqueeze(1));
    ctx->save_for_backward({x, weight, logits.to(x.scalar_type())});
    return loss.to(x.scalar_type());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1], &dlogits = saved[2];
    const at::Tensor& g = grad_out[0];
    return {at::mm(dlogits, weight).mul_(g), at::mm(dlogits.t(), x).mul_(g), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor vocab_range_lookup(const at::Tensor& weight, const at::Tensor& ids, int64_t first) {
  const at::Tensor elsewhere = ids.lt(first).logical_or(ids.ge(first + weight.size(0)));
  const at::Tensor found = nn::embedding_lookup(weight, (ids - first).masked_fill(elsewhere, 0));
  return found.masked_fill(elsewhere.unsqueeze(-1), 0);
}

at::Tensor vocab_parallel_cross_entropy(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& targets, int64_t first,
                                        dist::Group& group) {
  return VocabParallelCrossEntropy::apply(x, weight, targets, first, &group);
}

}  // namespace colossal::parallel
