// Shard arithmetic: see shard.h.
#include "src/nn/shard.h"

#include <ATen/ATen.h>
#include <stdexcept>
#include <string>

namespace colossal::nn {

std::vector<int64_t> ShardSpec::full_shape(at::IntArrayRef local) const {
  std::vector<int64_t> shape = local.vec();
  if (split()) shape.at(static_cast<size_t>(dim)) *= count;
  return shape;
}

at::Tensor ShardSpec::local_of(const at::Tensor& full) const {
  if (!split()) return full;
  const int64_t n = full.size(dim);
  if (n % (count * parts) != 0)
    throw std::invalid_argument("ShardSpec: dimension " + std::to_string(dim) + " of " + std::to_string(n) + " does not split into " +
                                std::to_string(parts) + " x " + std::to_string(count) + " pieces");
  const int64_t segment = n / parts, piece = segment / count;
  if (parts == 1) return full.narrow(dim, index * piece, piece);
  std::vector<at::Tensor> mine;
  for (int64_t s = 0; s < parts; ++s) mine.push_back(full.narrow(dim, s * segment + index * piece, piece));
  return at::cat(mine, dim);
}

at::Tensor ShardSpec::assemble(const std::vector<at::Tensor>& pieces) const {
  if (!split()) return pieces.at(0);
  if (static_cast<int64_t>(pieces.size()) != count) throw std::invalid_argument("ShardSpec::assemble: wrong number of pieces");
  const int64_t piece = pieces[0].size(dim) / parts;
  std::vector<at::Tensor> ordered;   // segment by segment, each rank's piece of it in rank order
  for (int64_t s = 0; s < parts; ++s)
    for (const auto& p : pieces) ordered.push_back(p.narrow(dim, s * piece, piece));
  return at::cat(ordered, dim);
}

}  // namespace colossal::nn
