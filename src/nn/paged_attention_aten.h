// Serving's paged attention (attention.h's PagedRows) on ATen alone, for any device and dtype: what a
// step takes where kernels/cpu/paged_attention (CPU fp32) does not apply, a GPU first. The same
// semantics: every row first writes its key and value into its sequence's slot, then attends causally
// over its sequence's positions [0, position]; ALiBi adds slope * (j - position) to key j's score.
//
// The rows are grouped by sequence (rows with the same block table), so each sequence's keys are
// gathered from the pool once for all its rows (a prompt chunk's tokens share them), padded to the
// longest sequence of the step, and the whole step is one scaled_dot_product_attention with a mask:
// a constant number of launches per layer, whatever the rows.
#pragma once
#include <ATen/core/Tensor.h>

#include "src/nn/attention.h"

namespace colossal::nn {

// packed [N, 1, 3C] (each row's q | k | v, C = heads * head_dim) against kv.k / kv.v [num_blocks, H,
// block_size, D] and kv.paged's rows; alibi_slopes [H] or undefined. Returns [N, 1, C].
at::Tensor aten_paged_attention(const at::Tensor& packed, LayerKv& kv, int64_t heads, const at::Tensor& alibi_slopes);

}  // namespace colossal::nn
