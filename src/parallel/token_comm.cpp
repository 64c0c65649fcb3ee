// Token-dimension communication pairs: see token_comm.h.
#include "src/parallel/token_comm.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <vector>

#include "src/core/error.h"
#include "src/dist/group.h"

namespace colossal::parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

dist::Group* group_of(AutogradContext* ctx) { return reinterpret_cast<dist::Group*>(ctx->saved_data["group"].toInt()); }

// [B, T, ...]'s sizes with T scaled by `num` / `den`.
std::vector<int64_t> with_tokens(const at::Tensor& x, int64_t num, int64_t den) {
  std::vector<int64_t> s = x.sizes().vec();
  s[1] = s[1] * num / den;
  return s;
}

// x [B, T, ...]'s tokens per rank of g (T / P), or Error when they do not split evenly.
int64_t tokens_each(const at::Tensor& x, const dist::Group& g) {
  if (x.size(1) % g.size() != 0)
    throw Error("tensor_sequence: " + std::to_string(x.size(1)) + " tokens do not split among " + std::to_string(g.size()) +
                " tensor-parallel ranks");
  return x.size(1) / g.size();
}

at::Tensor own_tokens(const at::Tensor& x, dist::Group& g) {
  const int64_t n = tokens_each(x, g);
  return x.narrow(1, g.rank() * n, n).contiguous();
}

struct SplitTokens : public torch::autograd::Function<SplitTokens> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, dist::Group* g) {
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(g);
    return own_tokens(x, *g);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {all_gather_tokens(grad[0], *group_of(ctx), "sequence-split token gradient"), at::Tensor()};
  }
};

struct JoinTokens : public torch::autograd::Function<JoinTokens> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, dist::Group* g) {
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(g);
    return all_gather_tokens(x, *g, "sequence-split tokens joined");
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) { return {own_tokens(grad[0], *group_of(ctx)), at::Tensor()}; }
};

struct GatherTokens : public torch::autograd::Function<GatherTokens> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, dist::Group* g) {
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(g);
    return all_gather_tokens(x, *g, "sequence-split tokens gathered");
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {reduce_scatter_tokens(grad[0], *group_of(ctx), "sequence-split input gradient"), at::Tensor()};
  }
};

struct ScatterTokens : public torch::autograd::Function<ScatterTokens> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, dist::Group* g) {
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(g);
    return reduce_scatter_tokens(x, *g, "sequence-split partial sums");
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {all_gather_tokens(grad[0], *group_of(ctx), "sequence-split output gradient"), at::Tensor()};
  }
};

bool needs_autograd(const at::Tensor& x) { return at::GradMode::is_enabled() && x.requires_grad(); }

}  // namespace

at::Tensor all_gather_tokens(const at::Tensor& x, dist::Group& g, const char* what) {
  const at::Tensor mine = x.contiguous();
  at::Tensor whole = at::empty({g.size() * mine.numel()}, mine.options());
  g.all_gather(whole, mine.view({-1}), what);
  return whole.view({g.size(), mine.size(0), mine.size(1), -1}).permute({1, 0, 2, 3}).reshape(with_tokens(mine, g.size(), 1));
}

at::Tensor reduce_scatter_tokens(const at::Tensor& x, dist::Group& g, const char* what) {
  const int64_t p = g.size();
  const at::Tensor whole = x.reshape({x.size(0), p, tokens_each(x, g), -1}).permute({1, 0, 2, 3}).contiguous();   // [P, B, Tl, rest]
  at::Tensor mine = at::empty(with_tokens(x, 1, p), x.options());
  g.reduce_scatter(mine.view({-1}), whole.view({-1}), what);
  return mine;
}

at::Tensor split_tokens(const at::Tensor& x, dist::Group& g) {
  if (g.size() == 1) return x;
  return needs_autograd(x) ? SplitTokens::apply(x, &g) : own_tokens(x, g);
}

at::Tensor join_tokens(const at::Tensor& x, dist::Group& g) {
  if (g.size() == 1) return x;
  return needs_autograd(x) ? JoinTokens::apply(x, &g) : all_gather_tokens(x, g, "sequence-split tokens joined");
}

at::Tensor gather_tokens(const at::Tensor& x, dist::Group& g) {
  if (g.size() == 1) return x;
  return needs_autograd(x) ? GatherTokens::apply(x, &g) : all_gather_tokens(x, g, "sequence-split tokens gathered");
}

at::Tensor scatter_tokens(const at::Tensor& x, dist::Group& g) {
  if (g.size() == 1) return x;
  return needs_autograd(x) ? ScatterTokens::apply(x, &g) : reduce_scatter_tokens(x, g, "sequence-split partial sums");
}

}  // namespace colossal::parallel
