// ShardSpec: how the parameter a tensor-parallel rank holds relates to the whole tensor, so that
// checkpoints, initialisation and loading work in whole (Hugging Face) tensors under any layout
// (ARCHITECTURE.md: "every parameter knows its full shape and how it is split").
//
// The rank holds piece `index` of `count` equal pieces along `dim`. When that dimension is `parts`
// equal segments laid end to end (attention's fused [q; k; v] rows), each segment is cut the same way
// and the rank's pieces of every segment sit side by side: rank r of 2 holds [q_r; k_r; v_r], so its
// heads stay whole.
#pragma once
#include <ATen/core/Tensor.h>
#include <cstdint>
#include <vector>

namespace colossal::nn {

struct ShardSpec {
  int64_t dim = -1;   // -1: every rank holds the whole tensor (replicated)
  int64_t count = 1;
  int64_t index = 0;
  int64_t parts = 1;

  bool split() const { return dim >= 0 && count > 1; }
  // The whole tensor's shape, from this rank's piece's.
  std::vector<int64_t> full_shape(at::IntArrayRef local) const;
  // This rank's piece of the whole tensor `full` (a view when it is one range, else a new tensor).
  at::Tensor local_of(const at::Tensor& full) const;
  // The whole tensor from every rank's piece, in rank order (each of `local`'s shape).
  at::Tensor assemble(const std::vector<at::Tensor>& pieces) const;
};

}  // namespace colossal::nn
