// 3D tensor-parallel layers: see tensor_parallel_3d.h.
#include "src/parallel/tensor_parallel_3d.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "src/core/error.h"
#include "src/dist/group.h"
#include "src/parallel/feature_split.h"
#include "src/parallel/tp_comm.h"

namespace colossal::parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using Axes = std::array<dist::Group*, 3>;

int64_t piece_of(int64_t n, int64_t pieces, const std::string& what) { return parallel::piece_of(n, pieces, "3d", what); }

// [n, k] on each rank of g -> [size * n, k], the ranks' rows in order.
at::Tensor gather_rows(const at::Tensor& x, dist::Group& g, const char* what) {
  if (g.size() == 1) return x;
  const at::Tensor mine = x.contiguous();
  at::Tensor whole = at::empty({g.size() * mine.size(0), mine.size(1)}, mine.options());
  g.all_gather(whole.view({-1}), mine.view({-1}), what);
  return whole;
}

// [size * n, k] on each rank of g -> the sum over the ranks of row block g.rank(): [n, k].
at::Tensor reduce_scatter_rows(const at::Tensor& x, dist::Group& g, const char* what) {
  if (g.size() == 1) return x;
  const at::Tensor whole = x.contiguous();
  at::Tensor mine = at::empty({whole.size(0) / g.size(), whole.size(1)}, whole.options());
  g.reduce_scatter(mine.view({-1}), whole.view({-1}), what);
  return mine;
}

// A weight gathered along W holds its out rows W block by W block, each [q, k, v] when fused; the layer
// wants [q, k, v] each W block by W block (heads in order). to_segments and from_segments convert.
at::Tensor to_segments(const at::Tensor& w, int64_t blocks, int64_t parts) {
  if (parts == 1) return w;
  return w.view({blocks, parts, -1, w.size(1)}).transpose(0, 1).reshape({w.size(0), w.size(1)});
}
at::Tensor from_segments(const at::Tensor& w, int64_t blocks, int64_t parts) {
  if (parts == 1) return w;
  return w.view({parts, blocks, -1, w.size(1)}).transpose(0, 1).reshape({w.size(0), w.size(1)});
}

struct Linear3dFn : public torch::autograd::Function<Linear3dFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w, dist::Group* a, dist::Group* wg, dist::Group* o,
                            int64_t parts) {
    const at::Tensor x2 = x.reshape({-1, x.size(-1)}).contiguous();   // [n, in/q]
    const at::Tensor xs = gather_rows(x2, *a, "3d input rows");          // [q n, in/q]
    const at::Tensor ws = to_segments(gather_rows(w, *wg, "3d weight rows"), wg->size(), parts);   // [out/q, in/q]
    const at::Tensor y = reduce_scatter_rows(at::mm(xs, ws.t()), *o, "3d output rows");           // [n, out/q]
    ctx->save_for_backward({x2, w});
    ctx->saved_data["groups"] = std::vector<int64_t>{reinterpret_cast<int64_t>(a), reinterpret_cast<int64_t>(wg), reinterpret_cast<int64_t>(o)};
    ctx->saved_data["parts"] = parts;
    ctx->saved_data["shape"] = x.sizes().vec();
    std::vector<int64_t> out = x.sizes().vec();
    out.back() = y.size(1);
    return y.view(out);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x2 = saved[0], &w = saved[1];
    const auto groups = ctx->saved_data["groups"].toIntVector();
    auto* a = reinterpret_cast<dist::Group*>(groups[0]);
    auto* wg = reinterpret_cast<dist::Group*>(groups[1]);
    auto* o = reinterpret_cast<dist::Group*>(groups[2]);
    const int64_t parts = ctx->saved_data["parts"].toInt();
    const at::Tensor dy = gather_rows(grad[0].reshape({-1, grad[0].size(-1)}), *o, "3d output gradient rows");   // [q n, out/q]
    const at::Tensor xs = gather_rows(x2, *a, "3d input rows");
    const at::Tensor ws = to_segments(gather_rows(w, *wg, "3d weight rows"), wg->size(), parts);
    const at::Tensor dx = reduce_scatter_rows(at::mm(dy, ws), *a, "3d input gradient");                        // [n, in/q]
    const at::Tensor dw = reduce_scatter_rows(from_segments(at::mm(dy.t(), xs), wg->size(), parts), *wg, "3d weight gradient");
    return {dx.view(ctx->saved_data["shape"].toIntVector()), dw, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// A cut of a parameter along cube axis `axis` (of `axes`): piece `dim` of the rank's coordinate, or whole.
nn::ShardCut cut(const Axes& axes, int64_t axis, int64_t dim, int64_t parts = 1) {
  const dist::Group* g = axes[static_cast<size_t>(axis)];
  return {dim, g->size(), g->rank(), parts, axis};
}

// The axes other than `keep`, in order: those a tensor whose features lie on `keep` is held whole along
// (the residual stream's, features on axis 2: its batch groups, feature_split.h).
std::vector<dist::Group*> others(const Axes& axes, int64_t keep) {
  std::vector<dist::Group*> out;
  for (int64_t i = 0; i < 3; ++i)
    if (i != keep) out.push_back(axes[static_cast<size_t>(i)]);
  return out;
}

class Linear3d : public nn::Linear {
 public:
  // Column (qkv, fc): roles (A, W, O) = axes (0, 1, 2); Row (the projections): (2, 1, 0).
  Linear3d(const nn::LinearSpec& s, const nn::LayerFactory& f, const Axes& axes) : axes_(axes), parts_(s.parts) {
    const bool first = s.split == nn::Split::Column;
    a_ = first ? 0 : 2, w_ = 1, o_ = first ? 2 : 0;
    const int64_t q = axes[0]->size();
    const int64_t in = piece_of(s.in, q, "a dense layer's input features");
    const int64_t out = piece_of(s.out, q * q * s.parts, "a dense layer's output features") * s.parts;
    weight_ = register_parameter("weight", f.parameter({out, in}), true,
                                 nn::ShardSpec{{cut(axes, a_, 0, s.parts), cut(axes, w_, 0, s.parts), cut(axes, o_, 1)}});
    if (s.bias)
      bias_ = register_parameter("bias", f.parameter({out * q}), true, nn::ShardSpec{{cut(axes, a_, 0, s.parts), cut(axes, w_, -1), cut(axes, o_, -1)}});
  }
  at::Tensor forward(const at::Tensor& x) override {
    auto g = [&](int64_t i) { return axes_[static_cast<size_t>(i)]; };
    at::Tensor y = Linear3dFn::apply(x, weight_, g(a_), g(w_), g(o_), parts_);
    return bias_.defined() ? y + held_whole(bias_, others(axes_, a_)) : y;   // output features lie on A
  }
  at::Tensor& weight() override { return weight_; }

 private:
  Axes axes_;
  int64_t parts_, a_ = 0, w_ = 1, o_ = 2;
  at::Tensor weight_, bias_;
};

}  // namespace

namespace {

// The stream on a cube: features along axis 2, rows along axes 0 and 1.
StreamLayout cube_stream(const Axes& axes) {
  return {axes[2], others(axes, 2), [axes](int64_t dim) { return nn::ShardSpec{{cut(axes, 0, -1), cut(axes, 1, -1), cut(axes, 2, dim)}}; },
          TensorParallel3d::row_block(axes), axes[0]->size() * axes[0]->size(), "3d"};
}

}  // namespace

TensorParallel3d::TensorParallel3d(std::array<dist::Group*, 3> axes, nn::ParamStorage storage, uint64_t seed)
    : FeatureSplitFactory(cube_stream(axes), storage, seed), axes_(axes) {
  if (axes[0]->size() != axes[1]->size() || axes[1]->size() != axes[2]->size()) throw Error("3d tensor parallelism needs a cube (internal)");
}

std::shared_ptr<nn::Linear> TensorParallel3d::block_linear(const nn::LinearSpec& spec) {
  return std::make_shared<Linear3d>(spec, *this, axes_);
}

nn::HeadRange TensorParallel3d::local_heads(int64_t heads) const {   // qkv's output features lie on axis 0
  const int64_t count = piece_of(heads, axes_[0]->size(), "the attention heads");
  return {axes_[0]->rank() * count, count};
}

std::function<at::Tensor(const at::Tensor&)> TensorParallel3d::attention_rows() const {
  return [a = axes_[0], piece = axes_[2]->rank()](const at::Tensor& mask) {
    if (mask.size(0) == 1) return mask;   // the same for every row
    const at::Tensor mine = mask.to(at::kByte).contiguous();
    at::Tensor rows = at::empty({a->size(), mine.numel()}, mine.options());
    a->all_gather(rows.view({-1}), mine.view({-1}), "3d attention mask rows");
    return rows[piece].view(mask.sizes()).to(mask.scalar_type());
  };
}

int64_t TensorParallel3d::row_block(const std::array<dist::Group*, 3>& axes) { return axes[1]->rank() * axes[1]->size() + axes[0]->rank(); }

}  // namespace colossal::parallel
