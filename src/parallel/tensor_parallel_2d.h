// 2D tensor parallelism (Optimus, SUMMA on a q x q grid; Colossal-AI's 2D): rank (i, j) of the grid
// holds activations X[batch rows i, :, features j] and, of every weight W [out, in], the block
// W[out j, in i]; so activations, parameters and their gradients all take 1/q^2 of the memory, where 1D
// keeps whole activations on every rank. A dense layer is SUMMA: for k = 0..q-1, X[:, in k] is
// broadcast along each grid row and W[:, in k] along each grid column, and every rank adds their
// product; backward broadcasts the same blocks again and reduces the partial products to their owners.
//
//   x_ij ─ LayerNorm (statistics summed along the row) ─ qkv (SUMMA; q, k, v of column j's heads) ─
//   attention of those heads over the rank's batch rows ─ proj (SUMMA) ─ ... ─ MLP (two SUMMAs)
//
// Embeddings, LayerNorm and the layers outside the blocks cut the features along the row and are held
// whole along the column (feature_split.h); the loss of a rank's rows becomes the batch's mean over the
// grid's row blocks (mean_over_row_blocks). Parameters held whole along the column (biases, norms,
// embeddings) sum their gradient along it. The grid's two groups come from the runtime
// (Runtime::tensor_axis): `column` = the ranks sharing this rank's j (axis 0, index i), `row` = those
// sharing its i (axis 1, index j). Batches are cut by rows before they reach the model (the engine).
//
// 2.5D (Tesseract, q x q x d): d such grids, each with its own block of the batch and the same weights;
// a weight's gradient, whole along each grid's column or not, is then summed over the d grids too (the
// `depth` group: the ranks with this rank's i and j in the other grids), and the loss is the mean over
// all d * q row blocks. Activations take 1/(d q^2) of the memory, parameters 1/q^2, and each grid's
// SUMMA moves 1/d of the batch.
#pragma once
#include <memory>

#include "src/parallel/feature_split.h"

namespace colossal::dist {
class Group;
}

namespace colossal::parallel {

// The layers outside the blocks (embeddings, LayerNorm, dense and output layers) are feature_split.h's.
class TensorParallel2d : public FeatureSplitFactory {
 public:
  // The groups must outlive the model. `depth`: 2.5D's (null: 2D). `seed`: the run's (attention dropout's streams).
  TensorParallel2d(dist::Group& column, dist::Group& row, nn::ParamStorage storage = nn::ParamStorage::allocated,
                   dist::Group* depth = nullptr, uint64_t seed = 0);

  nn::HeadRange local_heads(int64_t heads) const override;

 protected:
  std::shared_ptr<nn::Linear> block_linear(const nn::LinearSpec& spec) override;

 private:
  dist::Group &column_, &row_;
  dist::Group* depth_;
};

}  // namespace colossal::parallel
