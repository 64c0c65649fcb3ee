// CausalLM shared behaviour: see causal_lm.h.
#include "src/nn/causal_lm.h"

#include <ATen/ATen.h>

namespace colossal::nn {

at::Tensor CausalLM::loss(const at::Tensor& ids, const at::Tensor& targets) {
  auto logits = forward(ids);                                        // [B, T, V]
  return at::cross_entropy_loss(logits.view({-1, logits.size(-1)}), targets.reshape({-1}));
}

int64_t CausalLM::parameter_count() const {
  int64_t n = 0;
  for (const auto& p : parameters()) n += p.numel();
  return n;
}

}  // namespace colossal::nn
