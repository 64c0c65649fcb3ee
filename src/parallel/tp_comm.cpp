// Conjugate communication functions: see tp_comm.h.
#include "src/parallel/tp_comm.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "src/dist/group.h"

namespace colossal::parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

dist::Group* group_of(AutogradContext* ctx) { return reinterpret_cast<dist::Group*>(ctx->saved_data["group"].toInt()); }

at::Tensor summed(const at::Tensor& x, dist::Group& g, const char* what) {
  at::Tensor t = x.contiguous().clone();
  g.all_reduce(t, dist::Reduce::sum, what);
  return t;
}

at::Tensor own_slice(const at::Tensor& x, dist::Group& g) {
  const int64_t n = x.size(-1) / g.size();
  return x.narrow(-1, g.rank() * n, n).contiguous();
}

struct EnterRegion : public torch::autograd::Function<EnterRegion> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, dist::Group* g) {
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(g);
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {summed(grad[0], *group_of(ctx), "tensor-parallel input gradient"), at::Tensor()};
  }
};

struct LeaveRegion : public torch::autograd::Function<LeaveRegion> {
  static at::Tensor forward(AutogradContext*, const at::Tensor& x, dist::Group* g) {
    return summed(x, *g, "tensor-parallel partial sums");
  }
  static variable_list backward(AutogradContext*, variable_list grad) { return {grad[0], at::Tensor()}; }
};

struct SumOver : public torch::autograd::Function<SumOver> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, dist::Group* g) {
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(g);
    return summed(x, *g, "tensor-parallel sum");
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {summed(grad[0], *group_of(ctx), "tensor-parallel sum gradient"), at::Tensor()};
  }
};

struct GatherLast : public torch::autograd::Function<GatherLast> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, dist::Group* g) {
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(g);
    return all_gather_last(x, *g, "tensor-parallel gather");
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) { return {own_slice(grad[0], *group_of(ctx)), at::Tensor()}; }
};

struct TakeSlice : public torch::autograd::Function<TakeSlice> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, dist::Group* g) {
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(g);
    return own_slice(x, *g);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {all_gather_last(grad[0], *group_of(ctx), "tensor-parallel slice gradient"), at::Tensor()};
  }
};

// [..., n * size] partial on every rank -> this rank's [..., n] of the sum over the group.
at::Tensor reduce_scatter_last(const at::Tensor& x, dist::Group& g, const char* what) {
  const int64_t p = g.size(), n = x.size(-1) / p;
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = n;
  const at::Tensor whole = x.reshape({-1, p, n}).transpose(0, 1).contiguous();   // [P, rows, n]: each rank's block together
  at::Tensor mine = at::empty(shape, x.options());
  g.reduce_scatter(mine.view({-1}), whole.view({-1}), what);
  return mine;
}

struct GatherPartial : public torch::autograd::Function<GatherPartial> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, dist::Group* g) {
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(g);
    return all_gather_last(x, *g, "tensor-parallel feature gather");
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {reduce_scatter_last(grad[0], *group_of(ctx), "tensor-parallel feature gradient"), at::Tensor()};
  }
};

struct ScatterSum : public torch::autograd::Function<ScatterSum> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, dist::Group* g) {
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(g);
    return reduce_scatter_last(x, *g, "tensor-parallel partial sums by feature");
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {all_gather_last(grad[0], *group_of(ctx), "tensor-parallel partial sum gradient"), at::Tensor()};
  }
};

bool needs_autograd(const at::Tensor& x) { return at::GradMode::is_enabled() && x.requires_grad(); }

}  // namespace

at::Tensor all_gather_last(const at::Tensor& x, dist::Group& g, const char* what) {
  if (g.size() == 1) return x;
  const at::Tensor shard = x.contiguous();
  at::Tensor whole = at::empty({g.size() * shard.numel()}, shard.options());
  g.all_gather(whole, shard.reshape({-1}), what);
  // [P, ..., n] -> [..., P, n] -> [..., P * n]
  std::vector<int64_t> shape{g.size()};
  for (int64_t s : shard.sizes()) shape.push_back(s);
  at::Tensor stacked = whole.view(shape).movedim(0, -2);
  std::vector<int64_t> out = shard.sizes().vec();
  out.back() *= g.size();
  return stacked.reshape(out);
}

at::Tensor enter_region(const at::Tensor& x, dist::Group& g) {
  if (g.size() == 1 || !needs_autograd(x)) return x;
  return EnterRegion::apply(x, &g);
}

at::Tensor leave_region(const at::Tensor& x, dist::Group& g) {
  if (g.size() == 1) return x;
  if (!needs_autograd(x)) return summed(x, g, "tensor-parallel partial sums");
  return LeaveRegion::apply(x, &g);
}

at::Tensor sum_over(const at::Tensor& x, dist::Group& g) {
  if (g.size() == 1) return x;
  if (!needs_autograd(x)) return summed(x, g, "tensor-parallel sum");
  return SumOver::apply(x, &g);
}

at::Tensor gather_last(const at::Tensor& x, dist::Group& g) {
  if (g.size() == 1) return x;
  if (!needs_autograd(x)) return all_gather_last(x, g, "tensor-parallel gather");
  return GatherLast::apply(x, &g);
}

at::Tensor gather_partial(const at::Tensor& x, dist::Group& g) {
  if (g.size() == 1) return x;
  if (!needs_autograd(x)) return all_gather_last(x, g, "tensor-parallel feature gather");
  return GatherPartial::apply(x, &g);
}

at::Tensor scatter_sum(const at::Tensor& x, dist::Group& g) {
  if (g.size() == 1) return x;
  if (!needs_autograd(x)) return reduce_scatter_last(x, g, "tensor-parallel partial sums by feature");
  return ScatterSum::apply(x, &g);
}

at::Tensor take_slice(const at::Tensor& x, dist::Group& g) {
  if (g.size() == 1) return x;
  if (!needs_autograd(x)) return own_slice(x, g);
  return TakeSlice::apply(x, &g);
}

}  // namespace colossal::parallel
