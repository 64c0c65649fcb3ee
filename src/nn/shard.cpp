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

// Pieces [from, from + n) of the rank-ordered list, whose cuts from `axis` on remain, made whole.
at::Tensor assemble_from(const std::vector<at::Tensor>& pieces, size_t from, size_t n, const std::vector<ShardCut>& cuts, size_t axis) {
  if (axis == cuts.size()) return pieces.at(from);
  const auto count = static_cast<size_t>(cuts[axis].count), each = n / count;
  std::vector<at::Tensor> parts;
  for (size_t i = 0; i < count; ++i) parts.push_back(assemble_from(pieces, from + i * each, each, cuts, axis + 1));
  return join(parts, cuts[axis]);
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
  int64_t ranks = 1;
  for (const auto& c : cuts) ranks *= c.count;
  if (static_cast<int64_t>(pieces.size()) != ranks) throw std::invalid_argument("ShardSpec::assemble: wrong number of pieces");
  return assemble_from(pieces, 0, pieces.size(), cuts, 0);
}

}  // namespace colossal::nn
