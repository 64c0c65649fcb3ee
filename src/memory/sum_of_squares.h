// The sum of squares of tensors on an accelerator, for the global gradient norm: ATen's multi-tensor
// norm (each tensor's sum in fp32, whatever its dtype) then the squares summed in double, a few kernel
// launches for any number of tensors and no host synchronisation. The host's chunks take
// kernels/cpu's one-pass sum in double instead (zero_strategy.cpp).
#pragma once
#include <ATen/core/Tensor.h>
#include <vector>

namespace colossal::memory {

// A 0-d double tensor on the tensors' device (all on one); 0 for none.
at::Tensor sum_of_squares(const std::vector<at::Tensor>& tensors);

}  // namespace colossal::memory
