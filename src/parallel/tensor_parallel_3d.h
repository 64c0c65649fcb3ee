// 3D tensor parallelism (Bian et al. 2021, Colossal-AI's 3D) on a q x q x q cube of ranks: every
// activation, weight and gradient is cut q^3 ways, so each rank holds 1/P of all three, and a dense
// layer moves only 1/P^(2/3) of its matrices. With the cube's axes in three roles (input A, weight W,
// output O), a dense layer y = x W^T on x [rows/q^2, in/q] (rows cut by W then A, features by O) and a
// weight block [out/q^2, in/q] (out by A then W, in by O):
//   1. all-gathers x along A (the rows of its W block),
//   2. all-gathers the weight along W (out by A only),
//   3. multiplies: a partial sum over O's part of the input features,
//   4. reduce-scatters along O by rows: y [rows/q^2, out/q], rows cut by W then O, features by A.
// Backward gathers dy along O, reduce-scatters dx along A and dW along W. Output features land on the
// A axis, so the next layer swaps A and O (Colossal-AI's alternation): a block's qkv and fc layers use
// (A, W, O) = (axis 0, 1, 2), its projections (2, 1, 0), and every block starts and ends in the same
// layout: features on axis 2, rows on axis 1 then axis 0. Attention computes the heads of its rank's
// axis-0 coordinate over its rows. Embeddings, LayerNorm and the layers outside the blocks work on the
// features of axis 2 (feature_split.h); the loss is the mean over the q^2 row blocks. Parameters held
// whole along an axis sum their gradient over it.
#pragma once
#include <array>
#include <memory>

#include "src/parallel/feature_split.h"

namespace colossal::dist {
class Group;
}

namespace colossal::parallel {

// The layers outside the blocks are feature_split.h's, on the stream's features of axis 2.
class TensorParallel3d : public FeatureSplitFactory {
 public:
  // `axes`: the cube's groups (Runtime::tensor_axis 0, 1, 2), which must outlive the model.
  TensorParallel3d(std::array<dist::Group*, 3> axes, nn::ParamStorage storage = nn::ParamStorage::allocated, uint64_t seed = 0);

  nn::HeadRange local_heads(int64_t heads) const override;
  // Attention computes the rows of block (axis 1, axis 2), its input holds block (axis 1, axis 0): the
  // mask of its rows is gathered along axis 0 and the piece of this rank's axis-2 coordinate taken.
  std::function<at::Tensor(const at::Tensor&)> attention_rows() const override;

  // This rank's block of a batch's rows: index (axis-1 coordinate) * q + (axis-0 coordinate) of q^2.
  static int64_t row_block(const std::array<dist::Group*, 3>& axes);

 protected:
  std::shared_ptr<nn::Linear> block_linear(const nn::LinearSpec& spec) override;

 private:
  std::array<dist::Group*, 3> axes_;
};

}  // namespace colossal::parallel
