// Shard arithmetic: see shard.h.
#include "src/nn/shard.h"

#include <ATen/ATen.h>
#include <stdexcept>
#include <string>

namespace colossal::nn {
namespace {

// The piece `index` of `count` along c.dim of t, each of c.parts segments cut alike.
at::Tensor cut(const at::Tensor& t, const ShardCut& c, int64_t index) {
  const int64_t n = t.size(c.dim);
  if (n % (c.count * c.parts) != 0)
    throw std::invalid_argument("ShardSpec: dimension " + std::to_string(c.dim) + " of " + std::to_string(n) + " does not split into " +
                                std::to_string(c.parts) + " x " + std::to_string(c.count) + " pieces");
  const int64_t segment = n / c.parts, piece = segment / c.count;
  if (c.parts == 1) return t.narrow(c.dim, index * piece, piece);
  std::vector<at::Tensor> mine;
  for (int64_t s = 0; s < c.parts; ++s) mine.push_back(t.narrow(c.dim, s * segment + index * piece, piece));
  return at::cat(mine, c.dim);
}

// cut's inverse: the pieces of every index along one axis, in order.
at::Tensor join(const std::vector<at::Tensor>& pieces, const ShardCut& c) {
  if (c.dim < 0) return pieces.at(0);   // the same tensor on every rank of this axis
  const int64_t piece = pieces[0].size(c.dim) / c.parts;
  std::vector<at::Tensor> ordered;   // segment by segment, each index's piece of it in order
  for (int64_t s = 0; s < c.parts; ++s)
    for (const auto& p : pieces) ordered.push_back(p.narrow(c.dim, s * piece, piece));
  return at::cat(ordered, c.dim);
}

// The whole tensor from the rank-ordered pieces, cuts from `k` on still to undo; `digit` holds each
// axis's coordinate fixed so far (every axis has a cut, so all are fixed at the end).
at::Tensor assemble_from(const std::vector<at::Tensor>& pieces, const std::vector<ShardCut>& cuts, size_t k, std::vector<int64_t>& digit,
                         const std::vector<int64_t>& stride) {
  if (k == cuts.size()) {
    int64_t rank = 0;
    for (size_t a = 0; a < digit.size(); ++a) rank += digit[a] * stride[a];
    return pieces.at(static_cast<size_t>(rank));
  }
  const ShardCut& c = cuts[k];
  const auto a = static_cast<size_t>(c.axis >= 0 ? c.axis : static_cast<int64_t>(k));
  if (c.dim < 0) {   // the same on every rank of this axis: rank 0's
    digit[a] = 0;
    return assemble_from(pieces, cuts, k + 1, digit, stride);
  }
  std::vector<at::Tensor> parts;
  for (int64_t i = 0; i < c.count; ++i) {
    digit[a] = i;
    parts.push_back(assemble_from(pieces, cuts, k + 1, digit, stride));
  }
  return join(parts, c);
}

}  // namespace

bool ShardSpec::split() const {
  for (const auto& c : cuts)
    if (c.dim >= 0 && c.count > 1) return true;
  return false;
}

int64_t ShardSpec::copies(int64_t group) const {
  if (cuts.empty()) return group;
  int64_t n = 1;
  for (const auto& c : cuts)
    if (c.dim < 0) n *= c.count;
  return n;
}

std::vector<int64_t> ShardSpec::full_shape(at::IntArrayRef local) const {
  std::vector<int64_t> shape = local.vec();
  for (const auto& c : cuts)
    if (c.dim >= 0) shape.at(static_cast<size_t>(c.dim)) *= c.count;
  return shape;
}

at::Tensor ShardSpec::local_of(const at::Tensor& full) const {
  at::Tensor t = full;
  for (const auto& c : cuts)
    if (c.dim >= 0 && c.count > 1) t = cut(t, c, c.index);
  return t;
}

at::Tensor ShardSpec::assemble(const std::vector<at::Tensor>& pieces) const {
  if (!split()) return pieces.at(0);
  std::vector<int64_t> count(cuts.size(), 1);   // by axis
  for (size_t k = 0; k < cuts.size(); ++k) count.at(static_cast<size_t>(cuts[k].axis >= 0 ? cuts[k].axis : static_cast<int64_t>(k))) = cuts[k].count;
  std::vector<int64_t> stride(count.size(), 1), digit(count.size(), 0);
  int64_t ranks = 1;
  for (size_t a = count.size(); a-- > 0;) stride[a] = ranks, ranks *= count[a];
  if (static_cast<int64_t>(pieces.size()) != ranks) throw std::invalid_argument("ShardSpec::assemble: wrong number of pieces");
  return assemble_from(pieces, cuts, 0, digit, stride);
}

}  // namespace colossal::nn
