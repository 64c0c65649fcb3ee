// Encoder helpers: see encoder.h.
#include "src/nn/encoder.h"

#include <ATen/ATen.h>

namespace colossal::nn {

at::Tensor padding_mask(const at::Tensor& attention_mask) {
  if (!attention_mask.defined()) return {};
  return attention_mask.ne(0).view({attention_mask.size(0), 1, 1, attention_mask.size(1)});
}

}  // namespace colossal::nn
