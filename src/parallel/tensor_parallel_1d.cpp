// 1D tensor-parallel layers: see tensor_parallel_1d.h.
#include "src/parallel/tensor_parallel_1d.h"

#include <ATen/ATen.h>

#include "src/core/error.h"
#include "src/dist/group.h"
#include "src/nn/linear_forward.h"
#include "src/parallel/tensor_sequence.h"
#include "src/parallel/token_comm.h"
#include "src/parallel/tp_comm.h"
#include "src/parallel/vocab_cross_entropy.h"

namespace colossal::parallel {
namespace {

int64_t piece_of(int64_t n, int64_t ranks, const char* what) {
  if (n % ranks != 0)
    throw Error(std::string("tensor parallelism: ") + what + " of " + std::to_string(n) + " does not divide among " +
                std::to_string(ranks) + " ranks");
  return n / ranks;
}

// Output features split: W [out/P, in] and b [out/P]; y_r = x W_r^T + b_r, the input entering the region.
class ColumnLinear : public nn::Linear {
 public:
  // `tokens`: the input is this rank's tokens (tensor_sequence.h), gathered here.
  ColumnLinear(const nn::LinearSpec& s, const nn::LayerFactory& f, dist::Group& g, bool tokens) : group_(g), tokens_(tokens) {
    const int64_t ranks = g.size();
    piece_of(s.out, ranks * s.parts, "a column-split layer's output features");
    const nn::ShardSpec rows = nn::ShardSpec::along(0, ranks, g.rank(), s.parts);
    weight_ = register_parameter("weight", f.parameter({s.out / ranks, s.in}), true, rows);
    if (s.bias) bias_ = register_parameter("bias", f.parameter({s.out / ranks}), true, rows);
  }
  at::Tensor forward(const at::Tensor& x) override {
    return tokens_ ? gathered_linear(x, weight_, bias_, group_) : nn::linear_forward(enter_region(x, group_), weight_, bias_);
  }
  at::Tensor& weight() override { return weight_; }

 private:
  dist::Group& group_;
  bool tokens_;
  at::Tensor weight_, bias_;
};

// Input features split: W [out, in/P], b [out] whole; y = sum_r x_r W_r^T + b, the sum leaving the region.
class RowLinear : public nn::Linear {
 public:
  // `tokens`: the sum is reduce-scattered to each rank's tokens (tensor_sequence.h), the bias added to
  // them (its gradient summed over the ranks).
  RowLinear(const nn::LinearSpec& s, const nn::LayerFactory& f, dist::Group& g, bool tokens) : group_(g), tokens_(tokens) {
    const int64_t ranks = g.size();
    piece_of(s.in, ranks, "a row-split layer's input features");
    weight_ = register_parameter("weight", f.parameter({s.out, s.in / ranks}), true, nn::ShardSpec::along(1, ranks, g.rank()));
    if (s.bias) bias_ = register_parameter("bias", f.parameter({s.out}));
  }
  at::Tensor forward(const at::Tensor& x) override {
    const at::Tensor partial = nn::linear_forward(x, weight_);
    if (tokens_) {
      at::Tensor y = scatter_tokens(partial, group_);   // [B, T/P, out], summed
      return bias_.defined() ? y + enter_region(bias_, group_) : y;
    }
    at::Tensor y = leave_region(partial, group_);   // [..., out], summed
    return bias_.defined() ? y + bias_ : y;
  }
  at::Tensor& weight() override { return weight_; }

 private:
  dist::Group& group_;
  bool tokens_;
  at::Tensor weight_, bias_;
};

// Vocabulary rows [first, first + num/P): a lookup gives the rows this rank holds and zeros elsewhere,
// summed over the ranks; the tied head computes this range's logits.
class VocabEmbedding : public nn::Embedding {
 public:
  VocabEmbedding(int64_t num, int64_t dim, const nn::LayerFactory& f, dist::Group& g) : group_(g) {
    const int64_t ranks = g.size(), rows = piece_of(num, ranks, "the vocabulary");
    first_ = g.rank() * rows;
    weight_ = register_parameter("weight", f.parameter({rows, dim}), true, nn::ShardSpec::along(0, ranks, g.rank()));
  }
  at::Tensor forward(const at::Tensor& ids) override {   // [...] -> [..., dim]
    return leave_region(vocab_range_lookup(weight_, ids, first_), group_);
  }
  at::Tensor project(const at::Tensor& x) override {   // [..., dim] -> [..., num], gathered
    return gather_last(nn::linear_forward(enter_region(x, group_), weight_), group_);
  }
  at::Tensor head_cross_entropy(const at::Tensor& x, const at::Tensor& targets) override {
    return vocab_parallel_cross_entropy(enter_region(x, group_), weight_, targets, first_, group_);
  }
  at::Tensor& weight() override { return weight_; }

 private:
  dist::Group& group_;
  int64_t first_ = 0;
  at::Tensor weight_;
};

// A split layer whose piece another factory builds (a quantized one): the piece's parameters are this
// layer's under the same names, each registered with how it is cut, and the piece computes. Column:
// every parameter whose first dimension is the output's is cut along it (qweight, scales, bias).
// Row: the piece has no bias (it is added once, after the sum), and each parameter is compared with
// the same layer built whole (one output row is enough): a dimension that is P times larger there is
// cut (qweight, int4's packed bytes too, a rank's inputs being whole blocks of 32; scales in groups
// along the input), one that is not stays whole (per-channel scales [out, 1], as the rows they scale).
class PieceLinear : public nn::Linear {
 public:
  PieceLinear(const nn::LinearSpec& s, nn::LayerFactory& local, dist::Group& g) : row_(s.split == nn::Split::Row), group_(g) {
    const int64_t ranks = g.size();
    nn::LinearSpec piece = s;
    piece.split = nn::Split::Replicated;
    if (row_) {
      piece.in = piece_of(s.in, ranks, "a row-split layer's input features");
      piece.bias = false;
    } else {
      piece.out = piece_of(s.out, ranks * s.parts, "a column-split layer's output features") * s.parts;
    }
    piece_ = local.linear(piece);
    const auto whole = row_ ? local.linear({.in = s.in, .out = 1, .bias = false})->named_parameters() : nn::NamedParameters{};
    for (const auto& item : piece_->named_parameters()) {
      const at::Tensor& v = item.value();
      nn::ShardSpec shard;
      if (!row_ && v.dim() >= 1 && v.size(0) == piece.out) shard = nn::ShardSpec::along(0, ranks, g.rank(), s.parts);
      if (row_) {
        const at::Tensor& w = whole[item.key()];
        const int64_t d = v.dim() - 1;   // the input's dimension: the last
        if (w.size(d) == v.size(d) * ranks) shard = nn::ShardSpec::along(d, ranks, g.rank());
      }
      register_parameter(item.key(), v, v.requires_grad(), shard);
    }
    if (row_ && s.bias) bias_ = register_parameter("bias", local.parameter({s.out}), false);
  }
  at::Tensor forward(const at::Tensor& x) override {
    if (!row_) return piece_->forward(x);   // this rank's outputs; the input is the same on every rank
    at::Tensor y = leave_region(piece_->forward(x), group_);
    return bias_.defined() ? y + bias_ : y;
  }
  at::Tensor& weight() override { return piece_->weight(); }

 private:
  bool row_;
  dist::Group& group_;
  std::shared_ptr<nn::Linear> piece_;
  at::Tensor bias_;
};

// The vocabulary embedding of such a model: the piece is its range's rows.
class PieceEmbedding : public nn::Embedding {
 public:
  PieceEmbedding(int64_t num, int64_t dim, nn::LayerFactory& local, dist::Group& g) : group_(g) {
    rows_ = piece_of(num, g.size(), "the vocabulary");
    first_ = g.rank() * rows_;
    piece_ = local.embedding(rows_, dim, nn::Split::Vocab);
    for (const auto& item : piece_->named_parameters())
      register_parameter(item.key(), item.value(), item.value().requires_grad(), nn::ShardSpec::along(0, g.size(), g.rank()));
  }
  at::Tensor forward(const at::Tensor& ids) override {
    const at::Tensor elsewhere = ids.lt(first_).logical_or(ids.ge(first_ + rows_));
    const at::Tensor found = piece_->forward((ids - first_).masked_fill(elsewhere, 0));
    return leave_region(found.masked_fill(elsewhere.unsqueeze(-1), 0), group_);
  }
  at::Tensor project(const at::Tensor& x) override { return gather_last(piece_->project(x), group_); }
  at::Tensor& weight() override { return piece_->weight(); }
  c10::ScalarType output_dtype() override { return piece_->output_dtype(); }

 private:
  dist::Group& group_;
  int64_t first_ = 0, rows_ = 0;   // (the piece's weight need not be [rows, dim]: a packed one is not)
  std::shared_ptr<nn::Embedding> piece_;
};

}  // namespace

TensorParallel1d::TensorParallel1d(dist::Group& group, nn::ParamStorage storage, uint64_t seed, std::shared_ptr<nn::LayerFactory> local)
    : nn::LayerFactory(storage),
      group_(group),
      region_random_(std::make_shared<nn::RandomStream>(seed + 2718 + static_cast<uint64_t>(group.rank()))),
      local_(std::move(local)) {}

std::shared_ptr<nn::Linear> TensorParallel1d::linear(const nn::LinearSpec& spec) {
  const bool split = spec.split == nn::Split::Column || spec.split == nn::Split::Row;   // the others are whole here
  if (local_ && split) return std::make_shared<PieceLinear>(spec, *local_, group_);
  if (local_) return local_->linear(spec);
  switch (spec.split) {
    case nn::Split::Column: return std::make_shared<ColumnLinear>(spec, *this, group_, tokens_);
    case nn::Split::Row: return std::make_shared<RowLinear>(spec, *this, group_, tokens_);
    default: return nn::LayerFactory::linear(spec);
  }
}

std::shared_ptr<nn::Embedding> TensorParallel1d::embedding(int64_t num, int64_t dim, nn::Split split) {
  if (split == nn::Split::Vocab && local_) return std::make_shared<PieceEmbedding>(num, dim, *local_, group_);
  if (local_) return local_->embedding(num, dim, split);
  if (split == nn::Split::Vocab) return std::make_shared<VocabEmbedding>(num, dim, *this, group_);
  return nn::LayerFactory::embedding(num, dim, split);
}

std::shared_ptr<nn::LayerNorm> TensorParallel1d::layer_norm(int64_t dim, double eps) {
  if (tokens_ && in_blocks()) return token_split_layer_norm(dim, eps, *this, group_);
  return nn::LayerFactory::layer_norm(dim, eps);
}

std::shared_ptr<const nn::StreamCut> TensorParallel1d::stream_cut() const {
  if (tokens_ && in_blocks()) return token_split_stream(group_);
  return nn::LayerFactory::stream_cut();
}

nn::HeadRange TensorParallel1d::local_heads(int64_t heads) const {
  const int64_t count = piece_of(heads, group_.size(), "the attention heads");
  return {group_.rank() * count, count};
}

}  // namespace colossal::parallel
