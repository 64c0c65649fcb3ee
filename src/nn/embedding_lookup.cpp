// Embedding lookup: see embedding_lookup.h.
#include "src/nn/embedding_lookup.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "src/nn/gemm_choice.h"

namespace colossal::nn {
namespace {

struct EmbeddingLookup : public torch::autograd::Function<EmbeddingLookup> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& weight, const at::Tensor& ids) {
    ctx->save_for_backward({weight, ids});   // the weight for its .grad buffer, not its values
    return at::embedding(weight, ids);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor &weight = saved[0], &ids = saved[1];
    const at::Tensor flat_ids = ids.reshape({-1});
    const at::Tensor rows = grad_out[0].reshape({-1, weight.size(1)});
    if (at::Tensor acc = grad_buffer_of(weight, rows); acc.defined()) {
      acc.index_add_(0, flat_ids, rows);
      return {at::Tensor(), at::Tensor()};
    }
    return {at::embedding_dense_backward(rows, flat_ids, weight.size(0), /*padding_idx=*/-1, /*scale_grad_by_freq=*/false),
            at::Tensor()};
  }
};

}  // namespace

at::Tensor embedding_lookup(const at::Tensor& weight, const at::Tensor& ids) {
  if (!weight.requires_grad() || !at::GradMode::is_enabled()) return at::embedding(weight, ids);
  return EmbeddingLookup::apply(weight, ids);
}

}  // namespace colossal::nn
