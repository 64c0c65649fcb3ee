// Layers of the feature-split tensor-parallel modes: see feature_split.h.
#include "src/parallel/feature_split.h"

#include <ATen/ATen.h>

#include "src/core/error.h"
#include "src/dist/group.h"
#include "src/nn/embedding_lookup.h"
#include "src/nn/linear_forward.h"
#include "src/nn/random_stream.h"
#include "src/parallel/tp_comm.h"
#include "src/parallel/vocab_cross_entropy.h"

namespace colossal::parallel {

int64_t piece_of(int64_t n, int64_t pieces, const std::string& mode, const std::string& what) {
  if (n % pieces != 0)
    throw Error(mode + " tensor parallelism: " + what + " of " + std::to_string(n) + " does not divide into " + std::to_string(pieces) +
                " pieces");
  return n / pieces;
}

at::Tensor held_whole(const at::Tensor& p, const std::vector<dist::Group*>& batch) {
  at::Tensor t = p;
  for (dist::Group* g : batch) t = enter_region(t, *g);
  return t;
}

at::Tensor mean_over_row_blocks(const at::Tensor& loss, const std::vector<dist::Group*>& batch) {
  at::Tensor t = loss;
  for (dist::Group* g : batch) t = leave_region(t, *g) / static_cast<double>(g->size());
  return t;
}

namespace {

class LayoutStreamCut : public nn::StreamCut {
 public:
  explicit LayoutStreamCut(StreamLayout layout) : layout_(std::move(layout)) {}
  int64_t pieces() const override { return layout_.features->size(); }
  nn::ShardSpec shard(int64_t dim) const override { return dim < 0 ? nn::ShardSpec{} : layout_.cut(dim); }
  at::Tensor use(const at::Tensor& p) const override { return held_whole(p, layout_.batch); }
  at::Tensor dropout(const at::Tensor& x, double p) const override {   // x [rows, ..., features]
    std::vector<int64_t> whole = x.sizes().vec();
    whole.front() *= layout_.row_blocks;
    whole.back() *= pieces();
    const at::Tensor noise = nn::dropout_noise(whole, p, x.options());
    return x * noise.narrow(0, layout_.row_block * x.size(0), x.size(0)).narrow(-1, layout_.features->rank() * x.size(-1), x.size(-1));
  }

 private:
  StreamLayout layout_;
};

// A table whose rows are not the tied vocabulary (positions, token types): [num, dim/P], each rank's
// features of every row, so a lookup is local.
class FeatureColumnEmbedding : public nn::Embedding {
 public:
  FeatureColumnEmbedding(int64_t num, int64_t dim, const nn::LayerFactory& f, const StreamLayout& layout)
      : features_(*layout.features), batch_(layout.batch) {
    const int64_t width = piece_of(dim, features_.size(), layout.mode, "an embedding's width");
    weight_ = register_parameter("weight", f.parameter({num, width}), true, layout.cut(1));
  }
  at::Tensor forward(const at::Tensor& ids) override { return nn::embedding_lookup(held_whole(weight_, batch_), ids); }
  at::Tensor project(const at::Tensor& x) override {   // partial logits over this rank's features, summed
    return leave_region(nn::linear_forward(x, held_whole(weight_, batch_)), features_);
  }
  at::Tensor& weight() override { return weight_; }

 private:
  dist::Group& features_;
  std::vector<dist::Group*> batch_;
  at::Tensor weight_;
};

// A dense layer outside the blocks, stream to stream: W [out/P, in] (this rank's output features), the
// input's features gathered forward and the input gradient's partial sums reduce-scattered backward.
class StreamLinear : public nn::Linear {
 public:
  StreamLinear(const nn::LinearSpec& s, const nn::LayerFactory& f, const StreamLayout& layout)
      : features_(*layout.features), batch_(layout.batch) {
    const int64_t p = features_.size();
    piece_of(s.in, p, layout.mode, "a dense layer's input features");
    const int64_t out = piece_of(s.out, p, layout.mode, "a dense layer's output features");
    weight_ = register_parameter("weight", f.parameter({out, s.in}), true, layout.cut(0));
    if (s.bias) bias_ = register_parameter("bias", f.parameter({out}), true, layout.cut(0));
  }
  at::Tensor forward(const at::Tensor& x) override {
    return nn::linear_forward(gather_partial(x, features_), held_whole(weight_, batch_),
                              bias_.defined() ? held_whole(bias_, batch_) : bias_);
  }
  at::Tensor& weight() override { return weight_; }

 private:
  dist::Group& features_;
  std::vector<dist::Group*> batch_;
  at::Tensor weight_, bias_;
};

// An output layer (Split::Head): W [out, in/P], partial products over this rank's input features summed
// over the features group, the bias whole; every rank of the group then holds its rows' whole outputs.
class HeadLinear : public nn::Linear {
 public:
  HeadLinear(const nn::LinearSpec& s, const nn::LayerFactory& f, const StreamLayout& layout)
      : features_(*layout.features), batch_(layout.batch) {
    const int64_t in = piece_of(s.in, features_.size(), layout.mode, "an output layer's input features");
    weight_ = register_parameter("weight", f.parameter({s.out, in}), true, layout.cut(1));
    if (s.bias) bias_ = register_parameter("bias", f.parameter({s.out}));
  }
  at::Tensor forward(const at::Tensor& x) override {
    at::Tensor y = leave_region(nn::linear_forward(x, held_whole(weight_, batch_)), features_);
    return bias_.defined() ? y + held_whole(bias_, batch_) : y;
  }
  at::Tensor& weight() override { return weight_; }

 private:
  dist::Group& features_;
  std::vector<dist::Group*> batch_;
  at::Tensor weight_, bias_;
};

}  // namespace

FeatureSplitFactory::FeatureSplitFactory(StreamLayout layout, nn::ParamStorage storage, uint64_t seed)
    : nn::LayerFactory(storage), layout_(std::move(layout)) {
  const int64_t rank = layout_.row_block * layout_.features->size() + layout_.features->rank();   // unique in the tensor group
  region_random_ = std::make_shared<nn::RandomStream>(seed + 2718 + static_cast<uint64_t>(rank));
}

std::shared_ptr<nn::Linear> FeatureSplitFactory::linear(const nn::LinearSpec& spec) {
  switch (spec.split) {
    case nn::Split::Column:
    case nn::Split::Row: return block_linear(spec);
    case nn::Split::Head: return std::make_shared<HeadLinear>(spec, *this, layout_);
    default: return std::make_shared<StreamLinear>(spec, *this, layout_);
  }
}

std::shared_ptr<nn::Embedding> FeatureSplitFactory::embedding(int64_t num, int64_t dim, nn::Split split) {
  if (split == nn::Split::Vocab) return std::make_shared<FeatureSplitEmbedding>(num, dim, *this, layout_);
  return std::make_shared<FeatureColumnEmbedding>(num, dim, *this, layout_);
}

std::shared_ptr<nn::LayerNorm> FeatureSplitFactory::layer_norm(int64_t dim, double eps) {
  return std::make_shared<FeatureSplitLayerNorm>(dim, eps, *this, layout_);
}

std::shared_ptr<const nn::StreamCut> FeatureSplitFactory::stream_cut() const { return std::make_shared<LayoutStreamCut>(layout_); }

FeatureSplitEmbedding::FeatureSplitEmbedding(int64_t num, int64_t dim, const nn::LayerFactory& f, const StreamLayout& layout)
    : features_(*layout.features), batch_(layout.batch) {
  const int64_t rows = piece_of(num, features_.size(), layout.mode, "the vocabulary");
  piece_of(dim, features_.size(), layout.mode, "an embedding's width");
  first_ = features_.rank() * rows;
  weight_ = register_parameter("weight", f.parameter({rows, dim}), true, layout.cut(0));
}

at::Tensor FeatureSplitEmbedding::forward(const at::Tensor& ids) {
  return scatter_sum(vocab_range_lookup(held_whole(weight_, batch_), ids, first_), features_);
}

at::Tensor FeatureSplitEmbedding::project(const at::Tensor& x) {
  return gather_last(nn::linear_forward(gather_partial(x, features_), held_whole(weight_, batch_)), features_);
}

at::Tensor FeatureSplitEmbedding::head_cross_entropy(const at::Tensor& x, const at::Tensor& targets) {
  return vocab_parallel_cross_entropy(gather_partial(x, features_), held_whole(weight_, batch_), targets, first_, features_);
}

FeatureSplitLayerNorm::FeatureSplitLayerNorm(int64_t dim, double eps, const nn::LayerFactory& f, const StreamLayout& layout)
    : nn::LayerNorm(piece_of(dim, layout.features->size(), layout.mode, "a LayerNorm's width"), eps, f, layout.cut(0)),
      whole_(dim),
      features_(*layout.features),
      batch_(layout.batch) {}

at::Tensor FeatureSplitLayerNorm::forward(const at::Tensor& x) {
  const double n = static_cast<double>(whole_);
  const at::Tensor mean = sum_over(x.sum(-1, true), features_) / n;
  const at::Tensor centred = x - mean;
  const at::Tensor var = sum_over((centred * centred).sum(-1, true), features_) / n;
  return centred * at::rsqrt(var + eps_) * held_whole(weight, batch_) + held_whole(bias, batch_);
}

}  // namespace colossal::parallel
