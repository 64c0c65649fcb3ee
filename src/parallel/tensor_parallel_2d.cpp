// 2D tensor-parallel layers: see tensor_parallel_2d.h.
#include "src/parallel/tensor_parallel_2d.h"

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

// The groups a 2D (or 2.5D) layer talks to.
struct Grid {
  dist::Group& column;
  dist::Group& row;
  dist::Group* depth;   // 2.5D only
  int64_t q() const { return row.size(); }
  // The cuts of a parameter: whole along the depth (2.5D), then along the column either cut (in
  // features: `column_dim`) or whole (-1), then along the row cut by `row_dim`.
  nn::ShardSpec cuts(int64_t column_dim, int64_t row_dim, int64_t parts = 1) const {
    nn::ShardSpec s;
    if (depth) s.cuts.push_back({-1, depth->size(), depth->rank(), 1});
    s.cuts.push_back({column_dim, q(), column.rank(), 1});
    s.cuts.push_back({row_dim, q(), row.rank(), parts});
    return s;
  }
  // The groups along which a rank's rows are cut and its other parameters held whole: the column, and
  // 2.5D's depth (feature_split.h).
  std::vector<dist::Group*> batch() const { return depth ? std::vector<dist::Group*>{&column, depth} : std::vector<dist::Group*>{&column}; }
};

int64_t piece_of(int64_t n, int64_t q, const std::string& what) { return parallel::piece_of(n, q, "2d", what); }

// This rank's block of a tensor `copy` broadcast from member `root` of `g` (the root sends its own).
at::Tensor block_from(const at::Tensor& mine, int64_t root, dist::Group& g, const char* what) {
  at::Tensor t = g.rank() == root ? mine.contiguous() : at::empty_like(mine, at::MemoryFormat::Contiguous);
  g.broadcast(t, root, what);
  return t;
}

// SUMMA: y_ij [rows, out/q] = sum_k x_ik [rows, in/q] W[out j, in k]^T, the x blocks broadcast along the
// row and the W blocks along the column. Backward broadcasts them again and reduces dx's partial
// products along the row and dW's along the column, each onto the rank that owns the block.
struct Summa : public torch::autograd::Function<Summa> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w, dist::Group* column, dist::Group* row) {
    const int64_t q = row->size();
    const at::Tensor x2 = x.reshape({-1, x.size(-1)}).contiguous();   // [rows, in/q]
    at::Tensor y = at::zeros({x2.size(0), w.size(0)}, x2.options());  // [rows, out/q]
    for (int64_t k = 0; k < q; ++k) {
      const at::Tensor a = block_from(x2, k, *row, "2d activation block");
      const at::Tensor b = block_from(w, k, *column, "2d weight block");
      y.addmm_(a, b.t());
    }
    ctx->save_for_backward({x2, w});
    ctx->saved_data["column"] = reinterpret_cast<int64_t>(column);
    ctx->saved_data["row"] = reinterpret_cast<int64_t>(row);
    ctx->saved_data["shape"] = x.sizes().vec();
    std::vector<int64_t> out = x.sizes().vec();
    out.back() = w.size(0);
    return y.view(out);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x2 = saved[0], &w = saved[1];
    auto* column = reinterpret_cast<dist::Group*>(ctx->saved_data["column"].toInt());
    auto* row = reinterpret_cast<dist::Group*>(ctx->saved_data["row"].toInt());
    const at::Tensor dy = grad[0].reshape({-1, w.size(0)}).contiguous();   // [rows, out/q]
    at::Tensor dx, dw;
    for (int64_t k = 0; k < row->size(); ++k) {
      at::Tensor part = at::mm(dy, block_from(w, k, *column, "2d weight block"));   // [rows, in/q]: dx_ik's share from column j
      row->reduce(part, k, "2d input gradient");
      if (row->rank() == k) dx = part;
      at::Tensor wpart = at::mm(dy.t(), block_from(x2, k, *row, "2d activation block"));   // [out/q, in/q]: dW's share from row i
      column->reduce(wpart, k, "2d weight gradient");
      if (column->rank() == k) dw = wpart;
    }
    return {dx.view(ctx->saved_data["shape"].toIntVector()), dw, at::Tensor(), at::Tensor()};
  }
};

// W[out j, in i] and b[out j] (b whole along the column); parts: the output's segments (q, k, v).
class Linear2d : public nn::Linear {
 public:
  Linear2d(const nn::LinearSpec& s, const nn::LayerFactory& f, const Grid& grid) : grid_(grid) {
    const int64_t q = grid.q();
    piece_of(s.in, q, "a dense layer's input features");
    piece_of(s.out, q * s.parts, "a dense layer's output features");
    weight_ = register_parameter("weight", f.parameter({s.out / q, s.in / q}), true, grid.cuts(1, 0, s.parts));
    if (s.bias) bias_ = register_parameter("bias", f.parameter({s.out / q}), true, grid.cuts(-1, 0, s.parts));
  }
  at::Tensor forward(const at::Tensor& x) override {
    // the weight's gradient also sums over the other grids (2.5D), which hold the same block
    at::Tensor y = Summa::apply(x, grid_.depth ? enter_region(weight_, *grid_.depth) : weight_, &grid_.column, &grid_.row);
    return bias_.defined() ? y + held_whole(bias_, grid_.batch()) : y;
  }
  at::Tensor& weight() override { return weight_; }

 private:
  Grid grid_;
  at::Tensor weight_, bias_;
};

}  // namespace

namespace {

// The stream on a grid: features along the row, rows along the column (and 2.5D's depth).
StreamLayout grid_stream(dist::Group& column, dist::Group& row, dist::Group* depth) {
  const Grid grid{column, row, depth};
  const int64_t layer = depth ? depth->rank() : 0, layers = depth ? depth->size() : 1;
  return {&row, grid.batch(), [grid](int64_t dim) { return grid.cuts(-1, dim); }, layer * column.size() + column.rank(),
          layers * column.size(), "2d"};
}

}  // namespace

TensorParallel2d::TensorParallel2d(dist::Group& column, dist::Group& row, nn::ParamStorage storage, dist::Group* depth, uint64_t seed)
    : FeatureSplitFactory(grid_stream(column, row, depth && depth->size() > 1 ? depth : nullptr), storage, seed),
      column_(column),
      row_(row),
      depth_(depth && depth->size() > 1 ? depth : nullptr) {
  if (column.size() != row.size()) throw Error("2d tensor parallelism needs a square grid (internal)");
}

std::shared_ptr<nn::Linear> TensorParallel2d::block_linear(const nn::LinearSpec& spec) {
  return std::make_shared<Linear2d>(spec, *this, Grid{column_, row_, depth_});
}

nn::HeadRange TensorParallel2d::local_heads(int64_t heads) const {
  const int64_t count = piece_of(heads, row_.size(), "the attention heads");
  return {row_.rank() * count, count};
}

}  // namespace colossal::parallel
