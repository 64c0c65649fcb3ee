// Sum of squares over tensors on one device: see sum_of_squares.h.
#include "src/memory/sum_of_squares.h"

#include <ATen/ATen.h>

namespace colossal::memory {

at::Tensor sum_of_squares(const std::vector<at::Tensor>& tensors) {
  if (tensors.empty()) return at::zeros({}, at::kDouble);
  const std::vector<at::Tensor> norms = at::_foreach_norm(tensors, 2, at::kFloat);
  return at::stack(norms).to(at::kDouble).square().sum();
}

}  // namespace colossal::memory
