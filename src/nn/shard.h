// ShardSpec: how the parameter a tensor-parallel rank holds relates to the whole tensor, so that
// checkpoints, initialisation, loading and norms work in whole (Hugging Face) tensors under any layout
// (ARCHITECTURE.md: "every parameter knows its full shape and how it is split").
//
// The tensor-parallel group is a grid of one axis (1D) or several (2D's q x q, ...); a tensor-parallel
// rank's index is its coordinates read as digits, the first axis the most significant. A ShardSpec has
// one cut per axis (in axis order, or in any order with each cut naming its axis: cuts apply in list
// order, the first the coarsest, as 3D's weights cut one dimension by two axes): along an axis of
// `count` ranks the rank holds piece `index` of
// `count` equal pieces of dimension `dim`, or (dim -1) the same as its peers along that axis. When the
// cut dimension is `parts` equal segments laid end to end (attention's fused [q; k; v] rows), each
// segment is cut the same way and the rank's pieces sit side by side: rank r of 2 holds [q_r; k_r; v_r],
// so its heads stay whole. No cuts at all: every rank of the group holds the whole tensor.
#pragma once
#include <ATen/core/Tensor.h>
#include <cstdint>
#include <vector>

namespace colossal::nn {

struct ShardCut {
  int64_t dim = -1;   // -1: replicated along this axis
  int64_t count = 1;
  int64_t index = 0;
  int64_t parts = 1;
  int64_t axis = -1;  // the grid axis it cuts along; -1: its position in the list
};

struct ShardSpec {
  std::vector<ShardCut> cuts;

  // One axis: piece `index` of `count` along `dim` (1D tensor parallelism).
  static ShardSpec along(int64_t dim, int64_t count, int64_t index, int64_t parts = 1) { return {{{dim, count, index, parts}}}; }

  bool split() const;   // some axis cuts it
  // Ranks of the group holding this same piece: `group` when it has no cuts (replicated everywhere),
  // else the product of the replicated axes' counts.
  int64_t copies(int64_t group) const;
  // The whole tensor's shape, from this rank's piece's.
  std::vector<int64_t> full_shape(at::IntArrayRef local) const;
  // This rank's piece of the whole tensor `full` (a view when it is one range, else a new tensor).
  at::Tensor local_of(const at::Tensor& full) const;
  // The whole tensor from every tensor-parallel rank's piece, in rank order (each of `local`'s shape).
  at::Tensor assemble(const std::vector<at::Tensor>& pieces) const;
};

}  // namespace colossal::nn
