// Layers of the feature-split tensor-parallel modes: see feature_split.h.
#include "src/parallel/feature_split.h"

#include <ATen/ATen.h>

#include "src/core/error.h"
#include "src/dist/group.h"
#include "src/nn/linear_forward.h"
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

FeatureSplitEmbedding::FeatureSplitEmbedding(int64_t num, int64_t dim, const nn::LayerFactory& f, dist::Group& features,
                                             std::vector<dist::Group*> batch, const nn::ShardSpec& shard, const std::string& mode)
    : features_(features), batch_(std::move(batch)) {
  const int64_t rows = piece_of(num, features.size(), mode, "an embedding's rows (the vocabulary or positions)");
  piece_of(dim, features.size(), mode, "an embedding's width");
  first_ = features.rank() * rows;
  weight_ = register_parameter("weight", f.parameter({rows, dim}), true, shard);
}

at::Tensor FeatureSplitEmbedding::forward(const at::Tensor& ids) {
  return scatter_sum(vocab_range_lookup(held_whole(weight_, batch_), ids, first_), features_);
}

at::Tensor FeatureSplitEmbedding::project(const at::Tensor& x) {
  return gather_last(nn::linear_forward(gather_partial(x, features_), held_whole(weight_, batch_)), features_);
}

at::Tensor FeatureSplitEmbedding::head_cross_entropy(const at::Tensor& x, const at::Tensor& targets) {
  at::Tensor loss = vocab_parallel_cross_entropy(gather_partial(x, features_), held_whole(weight_, batch_), targets, first_, features_);
  for (dist::Group* g : batch_) loss = leave_region(loss, *g) / static_cast<double>(g->size());
  return loss;
}

FeatureSplitLayerNorm::FeatureSplitLayerNorm(int64_t dim, double eps, const nn::LayerFactory& f, dist::Group& features,
                                             std::vector<dist::Group*> batch, const nn::ShardSpec& shard, const std::string& mode)
    : nn::LayerNorm(piece_of(dim, features.size(), mode, "a LayerNorm's width"), eps, f, shard),
      whole_(dim),
      features_(features),
      batch_(std::move(batch)) {}

at::Tensor FeatureSplitLayerNorm::forward(const at::Tensor& x) {
  const double n = static_cast<double>(whole_);
  const at::Tensor mean = sum_over(x.sum(-1, true), features_) / n;
  const at::Tensor centred = x - mean;
  const at::Tensor var = sum_over((centred * centred).sum(-1, true), features_) / n;
  return centred * at::rsqrt(var + eps_) * held_whole(weight, batch_) + held_whole(bias, batch_);
}

}  // namespace colossal::parallel
