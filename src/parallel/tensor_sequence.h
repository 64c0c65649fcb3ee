// Megatron-style sequence parallelism inside a 1D tensor group (`[parallel] tensor_sequence = true`;
// Korthikanti et al. 2022, Colossal-AI's "split_gather" sequence parallelism): between a block's
// row-split and column-split layers each tensor-parallel rank holds T / P tokens of every sequence,
// so the LayerNorms, dropouts and residual adds there compute and store 1/P of what 1D does, and the
// block's all-reduces become a reduce-scatter (after the row-split layers) and an all-gather (before
// the column-split ones), the same bytes (token_comm.h):
//
//   x [B, T/P, C] ─ LN ─ gather ─ qkv (column) ─ heads ─ proj (row) ─ scatter ─ dropout ─ + ─ LN ─ ...
//
// The blocks' input is split into tokens and their output joined again (run_blocks: StreamCut's
// enter_blocks and leave_blocks), so embeddings and heads see whole sequences as under 1D. The
// parameters used on a rank's tokens alone (the blocks' LayerNorms and row-split biases) are held
// whole on every rank, their gradients summed over the group; dropout keeps each rank's tokens of the
// whole sequence's masks, so a run equals one process.
#pragma once
#include <memory>

#include "src/nn/factory.h"
#include "src/nn/layer_norm.h"

namespace colossal::dist {
class Group;
}

namespace colossal::parallel {

// A column-split layer's product on this rank's tokens x [B, T/P, in]: y = gather(x) W^T + b
// [B, T, out]. Only x is kept for backward, which gathers it again (Megatron's trick: the gathered input,
// P times larger, is never stored between the passes); the input's gradient is reduce-scattered.
at::Tensor gathered_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, dist::Group& group);
// A block's LayerNorm on this rank's tokens.
std::shared_ptr<nn::LayerNorm> token_split_layer_norm(int64_t dim, double eps, const nn::LayerFactory& f, dist::Group& group);
// The stream inside the blocks: this rank's tokens.
std::shared_ptr<const nn::StreamCut> token_split_stream(dist::Group& group);

}  // namespace colossal::parallel
