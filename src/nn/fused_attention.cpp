// Fused causal attention: see fused_attention.h.
#include "src/nn/fused_attention.h"

#include <ATen/ATen.h>
#include <cmath>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include "kernels/cpu/attention.h"
#include "src/nn/kernel_choice.h"

namespace colossal::nn {
namespace {

kernels::AttentionDims dims_of(const at::Tensor& qkv, int64_t heads) {
  const int64_t c = qkv.size(2) / 3, d = c / heads;
  return {qkv.size(0), qkv.size(1), heads, d, static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)))};
}

struct FusedCausalAttention : public torch::autograd::Function<FusedCausalAttention> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& qkv_in, int64_t heads) {
    auto qkv = qkv_in.contiguous();
    const auto dims = dims_of(qkv, heads);
    auto y = at::empty({dims.batch, dims.seq, dims.heads * dims.head_dim}, qkv.options());
    auto lse = at::empty({dims.batch, heads, dims.seq}, qkv.options());
    kernels::causal_attention_forward(qkv.const_data_ptr<float>(), y.mutable_data_ptr<float>(), lse.mutable_data_ptr<float>(), dims);
    ctx->save_for_backward({qkv, y, lse});
    ctx->saved_data["heads"] = heads;
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor &qkv = saved[0], &y = saved[1], &lse = saved[2];
    const auto dims = dims_of(qkv, ctx->saved_data["heads"].toInt());
    auto dy = grad_out[0].contiguous();
    auto dqkv = at::empty_like(qkv);
    kernels::causal_attention_backward(qkv.const_data_ptr<float>(), y.const_data_ptr<float>(), lse.const_data_ptr<float>(),
                                       dy.const_data_ptr<float>(), dqkv.mutable_data_ptr<float>(), dims);
    return {dqkv, at::Tensor()};
  }
};

}  // namespace

bool fused_attention_applies(const at::Tensor& qkv) {
  return qkv.is_cpu() && qkv.scalar_type() == at::kFloat && qkv.dim() == 3 && qkv.size(1) <= kFusedAttentionMaxSeq;
}

at::Tensor aten_causal_attention(const at::Tensor& qkv, int64_t heads) {
  const int64_t b = qkv.size(0), t = qkv.size(1), c = qkv.size(2) / 3, d = c / heads;
  auto parts = qkv.view({b, t, 3, heads, d}).permute({2, 0, 3, 1, 4});            // [3, B, H, T, D]
  auto y = at::scaled_dot_product_attention(parts[0], parts[1], parts[2], {}, 0.0, true);   // [B, H, T, D]
  return y.transpose(1, 2).reshape({b, t, c});                                    // [B, T, C]
}

bool fused_attention_chosen(const at::Tensor& qkv, int64_t heads) {
  const auto dims = dims_of(qkv, heads);
  const bool grad = at::GradMode::is_enabled();
  const std::string shape = "B=" + std::to_string(dims.batch) + " T=" + std::to_string(dims.seq) +
                            " H=" + std::to_string(heads) + " D=" + std::to_string(dims.head_dim) +
                            (grad ? " fwd+bwd" : " fwd");
  if (auto d = decided_ours("attention", kernel_policy().attention, shape)) return *d;
  // Both sides run on a detached copy of this call's input, so timing never touches the real graph.
  const at::Tensor input = qkv.detach().clone().requires_grad_(grad);
  const at::Tensor dy = at::ones({dims.batch, dims.seq, dims.heads * dims.head_dim}, qkv.options());
  auto run = [&](at::Tensor (*attention)(const at::Tensor&, int64_t)) {
    auto y = attention(input, heads);
    if (grad) torch::autograd::grad({y}, {input}, {dy});
  };
  return time_and_choose("attention", shape, [&] { run(fused_causal_attention); }, [&] { run(aten_causal_attention); });
}

at::Tensor fused_causal_attention(const at::Tensor& qkv, int64_t heads) {
  TORCH_CHECK(qkv.dim() == 3 && qkv.size(2) % (3 * heads) == 0, "fused_causal_attention: qkv must be [B, T, 3C] with C divisible by ",
              heads, " heads, got ", qkv.sizes());
  return FusedCausalAttention::apply(qkv, heads);
}

}  // namespace colossal::nn
