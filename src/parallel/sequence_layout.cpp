// Which tokens a sequence-parallel rank holds: see sequence_layout.h.
#include "src/parallel/sequence_layout.h"

#include <ATen/ATen.h>

namespace colossal::parallel {

std::vector<int64_t> SequenceLayout::chunks_of(int64_t r) const {
  if (zigzag_) return {r, 2 * ranks_ - 1 - r};
  return {r};
}

at::Tensor SequenceLayout::local(const at::Tensor& x, int64_t dim) const {
  const int64_t c = x.size(dim) / chunks();
  std::vector<at::Tensor> parts;
  for (int64_t k : chunks_of(rank_)) parts.push_back(x.narrow(dim, k * c, c));
  return parts.size() == 1 ? parts[0].contiguous() : at::cat(parts, dim);
}

at::Tensor SequenceLayout::positions(int64_t t) const { return local(at::arange(t, at::kLong), 0); }

}  // namespace colossal::parallel
