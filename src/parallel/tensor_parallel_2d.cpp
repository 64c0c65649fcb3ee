// 2D tensor-parallel layers: see tensor_parallel_2d.h.
#include "src/parallel/tensor_parallel_2d.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "src/core/error.h"
#include "src/dist/group.h"
#include "src/nn/layer_norm.h"
#include "src/nn/linear_forward.h"
#include "src/parallel/tp_comm.h"
#include "src/parallel/vocab_cross_entropy.h"

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
  // A parameter whose gradient is summed over the ranks holding the same piece in the other grids.
  at::Tensor across_depth(const at::Tensor& p) const { return depth ? enter_region(p, *depth) : p; }
  // A parameter held whole along the column: its gradient sums the column's rows, and the other grids'.
  at::Tensor whole_along_column(const at::Tensor& p) const { return across_depth(enter_region(p, column)); }
};

int64_t piece_of(int64_t n, int64_t q, const std::string& what) {
  if (n % q != 0)
    throw Error("2d tensor parallelism: " + what + " of " + std::to_string(n) + " does not divide among the grid's " + std::to_string(q) +
                " rows and columns");
  return n / q;
}

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
    at::Tensor y = Summa::apply(x, grid_.across_depth(weight_), &grid_.column, &grid_.row);
    return bias_.defined() ? y + grid_.whole_along_column(bias_) : y;
  }
  at::Tensor& weight() override { return weight_; }

 private:
  Grid grid_;
  at::Tensor weight_, bias_;
};

// A table [num/q, dim]: row j's range of the vocabulary (or positions), whole along the column. A
// lookup's partial rows are reduce-scattered by features along the row (each rank then holds its
// features of every token); the tied head all-gathers the features along the row and computes its
// vocabulary range's logits, and the loss combines the ranges with two all-reduces of N values
// (vocab_cross_entropy.h), so the whole [N, vocab] logits never exist.
class Embedding2d : public nn::Embedding {
 public:
  Embedding2d(int64_t num, int64_t dim, const nn::LayerFactory& f, const Grid& grid) : grid_(grid) {
    const int64_t rows = piece_of(num, grid.q(), "an embedding's rows (the vocabulary or positions)");
    piece_of(dim, grid.q(), "an embedding's width");
    first_ = grid.row.rank() * rows;
    weight_ = register_parameter("weight", f.parameter({rows, dim}), true, grid.cuts(-1, 0));
  }
  at::Tensor forward(const at::Tensor& ids) override {   // this rank's batch rows [...] -> [..., dim/q]
    return scatter_sum(vocab_range_lookup(grid_.whole_along_column(weight_), ids, first_), grid_.row);
  }
  at::Tensor project(const at::Tensor& x) override {   // [..., dim/q] -> [..., num], gathered
    return gather_last(range_logits(x), grid_.row);
  }
  at::Tensor head_cross_entropy(const at::Tensor& x, const at::Tensor& targets) override {
    // The mean over this rank's rows, then over every row block (equal counts).
    at::Tensor loss = vocab_parallel_cross_entropy(gather_partial(x, grid_.row), grid_.whole_along_column(weight_), targets, first_, grid_.row);
    loss = leave_region(loss, grid_.column) / static_cast<double>(grid_.q());
    return grid_.depth ? leave_region(loss, *grid_.depth) / static_cast<double>(grid_.depth->size()) : loss;
  }
  at::Tensor& weight() override { return weight_; }

 private:
  at::Tensor range_logits(const at::Tensor& x) {   // [..., dim/q] -> [..., num/q]
    return nn::linear_forward(gather_partial(x, grid_.row), grid_.whole_along_column(weight_));
  }
  Grid grid_;
  int64_t first_ = 0;
  at::Tensor weight_;
};

// LayerNorm over features spread along the row: the mean and variance sum each rank's part.
class LayerNorm2d : public nn::LayerNorm {
 public:
  LayerNorm2d(int64_t dim, double eps, const nn::LayerFactory& f, const Grid& grid)
      : nn::LayerNorm(piece_of(dim, grid.q(), "a LayerNorm's width"), eps, f, grid.cuts(-1, 0)), whole_(dim), grid_(grid) {}
  at::Tensor forward(const at::Tensor& x) override {   // [..., dim/q]
    const double n = static_cast<double>(whole_);
    const at::Tensor mean = sum_over(x.sum(-1, true), grid_.row) / n;
    const at::Tensor centred = x - mean;
    const at::Tensor var = sum_over((centred * centred).sum(-1, true), grid_.row) / n;
    return centred * at::rsqrt(var + eps_) * grid_.whole_along_column(weight) + grid_.whole_along_column(bias);
  }

 private:
  int64_t whole_;
  Grid grid_;
};

}  // namespace

TensorParallel2d::TensorParallel2d(dist::Group& column, dist::Group& row, nn::ParamStorage storage, dist::Group* depth)
    : nn::LayerFactory(storage), column_(column), row_(row), depth_(depth && depth->size() > 1 ? depth : nullptr) {
  if (column.size() != row.size()) throw Error("2d tensor parallelism needs a square grid (internal)");
}

std::shared_ptr<nn::Linear> TensorParallel2d::linear(const nn::LinearSpec& spec) {
  if (spec.split == nn::Split::Replicated)
    throw Error("2d tensor parallelism: this model has a dense layer of " + std::to_string(spec.in) + " -> " + std::to_string(spec.out) +
                " features outside its blocks, which has no 2d layout yet (2d builds gpt, opt and bloom)");
  return std::make_shared<Linear2d>(spec, *this, Grid{column_, row_, depth_});
}

std::shared_ptr<nn::Embedding> TensorParallel2d::embedding(int64_t num, int64_t dim, nn::Split) {
  return std::make_shared<Embedding2d>(num, dim, *this, Grid{column_, row_, depth_});
}

std::shared_ptr<nn::LayerNorm> TensorParallel2d::layer_norm(int64_t dim, double eps) {
  return std::make_shared<LayerNorm2d>(dim, eps, *this, Grid{column_, row_, depth_});
}

nn::HeadRange TensorParallel2d::local_heads(int64_t heads) const {
  const int64_t count = piece_of(heads, row_.size(), "the attention heads");
  return {row_.rank() * count, count};
}

}  // namespace colossal::parallel
