// What 2D, 2.5D and 3D tensor parallelism share (tensor_parallel_2d.h, tensor_parallel_3d.h): on the
// residual stream a rank holds its block of the batch's rows and its block of the features, the
// features cut along one group (2D: the grid's row; 3D: the cube's third axis) and the rows along the
// others (the "batch groups": 2D's column and 2.5D's depth; 3D's first two axes). The modes differ in
// their dense layers inside the blocks; every layer outside them is built here, on the stream's layout
// alone:
//   - embeddings: the tied vocabulary table cut by rows along the features group (its lookup
//     reduce-scattered by features, its head computing the range's logits); other tables (positions,
//     token types) cut by features, so a lookup needs no communication;
//   - LayerNorm with statistics summed over the features group;
//   - dense layers outside the blocks (BERT's MLM transform and pooler, OPT's projections): the input's
//     features gathered, this rank's output features computed (a weight of out/P rows);
//   - output layers (Split::Head, a classifier): partial products over this rank's input features,
//     summed, so every rank has whole outputs for its rows;
//   - parameters a model adds to the stream itself, and dropout on the stream: each rank's rows and
//     features of the whole batch's mask (nn::StreamCut); attention's probabilities drop from each
//     rank's own stream (its rows and heads are its alone).
// Parameters cut by features only are held whole along the batch groups, whose ranks each add their
// rows' share of the gradient. A loss is the mean over this rank's rows; mean_over_row_blocks makes
// it the batch's.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "src/nn/factory.h"
#include "src/nn/layer_norm.h"

namespace colossal::dist {
class Group;
}

namespace colossal::parallel {

// How the residual stream is laid out over the tensor group.
struct StreamLayout {
  dist::Group* features = nullptr;     // the stream's features are cut along this group
  std::vector<dist::Group*> batch;     // and its rows along these
  // The cut of a parameter whose dimension `dim` runs over the stream's features, whole along the
  // batch groups (the cuts in the layout's axis order).
  std::function<nn::ShardSpec(int64_t dim)> cut;
  int64_t row_block = 0, row_blocks = 1;   // this rank's block of the batch's rows, of so many
  std::string mode;                    // "2d", "3d": named in errors
};

// n / pieces, or Error "<mode> tensor parallelism: <what> of n does not divide into <pieces> pieces".
int64_t piece_of(int64_t n, int64_t pieces, const std::string& mode, const std::string& what);

// A parameter held whole along every group of `batch`: its gradient summed over each (identity forward).
at::Tensor held_whole(const at::Tensor& p, const std::vector<dist::Group*>& batch);

// A loss that is the mean over this rank's rows -> the mean over every row block (equal row counts):
// summed over the batch groups and divided by their sizes, the gradient scaled to match.
at::Tensor mean_over_row_blocks(const at::Tensor& loss, const std::vector<dist::Group*>& batch);

// The layers outside the blocks for a feature-split layout; the modes add their dense block layers.
class FeatureSplitFactory : public nn::LayerFactory {
 public:
  // `seed`: the run's; each rank's attention-dropout stream derives from it.
  FeatureSplitFactory(StreamLayout layout, nn::ParamStorage storage, uint64_t seed);

  std::shared_ptr<nn::Linear> linear(const nn::LinearSpec& spec) override;
  std::shared_ptr<nn::Embedding> embedding(int64_t num, int64_t dim, nn::Split split = nn::Split::Replicated) override;
  std::shared_ptr<nn::LayerNorm> layer_norm(int64_t dim, double eps) override;
  std::shared_ptr<const nn::StreamCut> stream_cut() const override;
  // Attention's probabilities are this rank's rows and heads alone: their dropout draws from its own stream.
  std::shared_ptr<nn::RandomStream> region_random() override { return region_random_; }
  // The groups a batch's rows are cut along (what mean_over_row_blocks and the engine's sums take).
  const std::vector<dist::Group*>& batch_groups() const { return layout_.batch; }

 protected:
  // A column- or row-split dense layer inside a block.
  virtual std::shared_ptr<nn::Linear> block_linear(const nn::LinearSpec& spec) = 0;
  StreamLayout layout_;
  std::shared_ptr<nn::RandomStream> region_random_;
};

// The tied vocabulary table [num/P, dim] (P: the features group's size): this rank's range of the
// vocabulary, whole along the batch groups. A lookup's partial rows are reduce-scattered by features
// along the features group; the tied head all-gathers the features and computes its range's logits,
// and the loss combines the ranges with two all-reduces of N values (vocab_cross_entropy.h), so whole
// [N, vocab] logits never exist. The loss is the mean over this rank's rows.
class FeatureSplitEmbedding : public nn::Embedding {
 public:
  FeatureSplitEmbedding(int64_t num, int64_t dim, const nn::LayerFactory& f, const StreamLayout& layout);
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
  FeatureSplitLayerNorm(int64_t dim, double eps, const nn::LayerFactory& f, const StreamLayout& layout);
  at::Tensor forward(const at::Tensor& x) override;   // [..., dim/P]

 private:
  int64_t whole_;
  dist::Group& features_;
  std::vector<dist::Group*> batch_;
};

}  // namespace colossal::parallel
