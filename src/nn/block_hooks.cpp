// Block hooks: see block_hooks.h.
#include "src/nn/block_hooks.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "src/nn/recompute.h"

namespace colossal::nn {
namespace {

// Identity forward; its backward tells the chain that block `block`'s backward is about to start
// (`starting`) or has produced the gradient of the block's input.
struct BackwardBoundary : public torch::autograd::Function<BackwardBoundary> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const BlockHooks* hooks, int64_t block,
                            bool starting) {
    ctx->saved_data["hooks"] = reinterpret_cast<int64_t>(hooks);
    ctx->saved_data["block"] = block;
    ctx->saved_data["starting"] = starting;
    return x.view_as(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grad) {
    const auto* hooks = reinterpret_cast<const BlockHooks*>(ctx->saved_data["hooks"].toInt());
    const int64_t block = ctx->saved_data["block"].toInt();
    if (ctx->saved_data["starting"].toBool()) hooks->before_backward(block);
    else hooks->after_backward(block);
    return {grad[0], at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

void BlockHooks::before_backward(int64_t block) const {
  for (const auto& h : hooks_) h->before_backward(block);
}

void BlockHooks::after_backward(int64_t block) const {
  for (auto it = hooks_.rbegin(); it != hooks_.rend(); ++it) (*it)->after_backward(block);
}

at::Tensor BlockHooks::run(int64_t block, const at::Tensor& x, const std::function<at::Tensor(const at::Tensor&)>& forward) const {
  for (const auto& h : hooks_) h->before_forward(block);
  const bool grad = at::GradMode::is_enabled();
  at::Tensor in = x;
  if (grad) {
    if (!in.requires_grad()) in = in.detach().requires_grad_(true);
    in = BackwardBoundary::apply(in, this, block, /*starting=*/false);
  }
  at::Tensor out = grad && recomputes(block) ? recomputed(forward, in) : forward(in);
  if (grad && out.requires_grad()) out = BackwardBoundary::apply(out, this, block, /*starting=*/true);
  for (auto it = hooks_.rbegin(); it != hooks_.rend(); ++it) (*it)->after_forward(block);
  return out;
}

}  // namespace colossal::nn
