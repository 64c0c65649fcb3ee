// The layers 2D, 2.5D and 3D tensor parallelism share (tensor_parallel_2d.h, tensor_parallel_3d.h): on
// the residual stream a rank holds its block of the batch's rows and its block of the features, the
// features cut along one group (2D: the grid's row; 3D: the cube's third axis) and the rows along the
// others (the "batch groups": 2D's column and 2.5D's depth; 3D's first two axes). Parameters outside
// the dense layers are cut by features only, so they are held whole along the batch groups, whose
// ranks each add their rows' share of the gradient.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "src/nn/factory.h"
#include "src/nn/layer_norm.h"

namespace colossal::dist {
class Group;
}

namespace colossal::parallel {

// n / pieces, or Error "<mode> tensor parallelism: <what> of n does not divide into <pieces> pieces".
int64_t piece_of(int64_t n, int64_t pieces, const std::string& mode, const std::string& what);

// A parameter held whole along every group of `batch`: its gradient summed over each (identity forward).
at::Tensor held_whole(const at::Tensor& p, const std::vector<dist::Group*>& batch);

// A table [num/P, dim] (P: the features group's size): this rank's range of the vocabulary (or
// positions), whole along the batch groups. A lookup's partial rows are reduce-scattered by features
// along the features group; the tied head all-gathers the features and computes its range's logits,
// and the loss combines the ranges with two all-reduces of N values (vocab_cross_entropy.h), so whole
// [N, vocab] logits never exist; then the mean over every row block (equal counts).
class FeatureSplitEmbedding : public nn::Embedding {
 public:
  // `shard`: the table's cuts in the layout's axis order (the features group's cutting dimension 0).
  FeatureSplitEmbedding(int64_t num, int64_t dim, const nn::LayerFactory& f, dist::Group& features, std::vector<dist::Group*> batch,
                        const nn::ShardSpec& shard, const std::string& mode);
  at::Tensor forward(const at::Tensor& ids) override;   // this rank's rows [...] -> [..., dim/P]
  at::Tensor project(const at::Tensor& x) override;     // [..., dim/P] -> [..., num], gathered
  at::Tensor head_cross_entropy(const at::Tensor& x, const at::Tensor& targets) override;
  at::Tensor& weight() override { return weight_; }

 private:
  dist::Group& features_;
  std::vector<dist::Group*> batch_;
  int64_t first_ = 0;
  at::Tensor weight_;
};

// LayerNorm over features spread along the features group: its mean and variance sum every rank's part.
class FeatureSplitLayerNorm : public nn::LayerNorm {
 public:
  FeatureSplitLayerNorm(int64_t dim, double eps, const nn::LayerFactory& f, dist::Group& features, std::vector<dist::Group*> batch,
                        const nn::ShardSpec& shard, const std::string& mode);
  at::Tensor forward(const at::Tensor& x) override;   // [..., dim/P]

 private:
  int64_t whole_;
  dist::Group& features_;
  std::vector<dist::Group*> batch_;
};

}  // namespace colossal::parallel
