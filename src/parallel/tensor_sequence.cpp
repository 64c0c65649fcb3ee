// Megatron-style sequence parallelism's layers: see tensor_sequence.h.
#include "src/parallel/tensor_sequence.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <vector>

#include "src/dist/group.h"
#include "src/nn/gemm_choice.h"
#include "src/nn/linear_forward.h"
#include "src/parallel/token_comm.h"
#include "src/parallel/tp_comm.h"

namespace colossal::parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct GatheredLinearFn : public torch::autograd::Function<GatheredLinearFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, dist::Group* g) {
    const at::Tensor whole = all_gather_tokens(x, *g, "sequence-split tokens gathered");   // [B, T, in]
    const at::Tensor x2 = whole.view({-1, whole.size(-1)});
    const bool bias = b.numel() > 0;   // none arrives empty (Function::apply records every input's device)
    const at::Tensor b2 = bias ? b : at::Tensor();
    const at::Tensor y = nn::gemm_applies(x2, w) ? nn::gemm_linear(x2, w, b2) : at::linear(x2, w, b2);
    ctx->save_for_backward({x, w});
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(g);
    ctx->saved_data["bias"] = bias;
    return y.view({whole.size(0), whole.size(1), w.size(0)});
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w = saved[1];
    auto* g = reinterpret_cast<dist::Group*>(ctx->saved_data["group"].toInt());
    const at::Tensor dy = grad[0].reshape({-1, w.size(0)}).contiguous();   // [B T, out]
    const at::Tensor whole = all_gather_tokens(x, *g, "sequence-split tokens gathered again").view({-1, x.size(-1)});
    const bool ours = nn::gemm_applies(whole, w);
    at::Tensor dx, dw, db;
    if (ctx->needs_input_grad(0)) {
      const at::Tensor full = ours ? nn::gemm_input_grad(dy, w) : at::mm(dy, w);   // [B T, in]: this rank's features' share
      dx = reduce_scatter_tokens(full.view({x.size(0), -1, x.size(-1)}), *g, "sequence-split input gradient");
    }
    if (ctx->needs_input_grad(1)) dw = ours ? nn::gemm_weight_grad_for(w, dy, whole) : at::mm(dy.t(), whole);
    if (ctx->saved_data["bias"].toBool() && ctx->needs_input_grad(2)) db = dy.sum(0);
    return {dx, dw, db, at::Tensor()};
  }
};

class TokenSplitLayerNorm : public nn::LayerNorm {
 public:
  TokenSplitLayerNorm(int64_t dim, double eps, const nn::LayerFactory& f, dist::Group& g) : nn::LayerNorm(dim, eps, f), group_(g) {}
  at::Tensor forward(const at::Tensor& x) override {   // the parameters' gradients summed over the ranks' tokens
    return normalise(x, enter_region(weight, group_), enter_region(bias, group_));
  }

 private:
  dist::Group& group_;
};

class TokenSplitStream : public nn::StreamCut {
 public:
  explicit TokenSplitStream(dist::Group& g) : group_(g) {}
  at::Tensor dropout(const at::Tensor& x, double p) const override {   // x [B, T/P, ...]
    std::vector<int64_t> whole = x.sizes().vec();
    whole[1] *= group_.size();
    return x * nn::dropout_noise(whole, p, x.options()).narrow(1, group_.rank() * x.size(1), x.size(1));
  }
  at::Tensor enter_blocks(const at::Tensor& x) const override { return split_tokens(x, group_); }
  at::Tensor leave_blocks(const at::Tensor& x) const override { return join_tokens(x, group_); }

 private:
  dist::Group& group_;
};

}  // namespace

at::Tensor gathered_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, dist::Group& group) {
  if (group.size() == 1 || !at::GradMode::is_enabled()) return nn::linear_forward(gather_tokens(x, group), weight, bias);
  return GatheredLinearFn::apply(x.contiguous(), weight, bias.defined() ? bias : at::empty({0}, weight.options()), &group);
}

std::shared_ptr<nn::LayerNorm> token_split_layer_norm(int64_t dim, double eps, const nn::LayerFactory& f, dist::Group& group) {
  return std::make_shared<TokenSplitLayerNorm>(dim, eps, f, group);
}

std::shared_ptr<const nn::StreamCut> token_split_stream(dist::Group& group) { return std::make_shared<TokenSplitStream>(group); }

}  // namespace colossal::parallel
