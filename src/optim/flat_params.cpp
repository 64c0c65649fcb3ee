// Flat parameter buffers: see flat_params.h.
#include "src/optim/flat_params.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <cmath>

namespace colossal::optim {

FlatParams::FlatParams(nn::Module& module, double weight_decay) {
  // Decay applies to tensors that multiply activations (2-D and up), as in GPT-2/nanoGPT/HF recipes.
  std::vector<std::pair<std::string, at::Tensor>> decay, no_decay;
  for (auto& item : module.named_parameters()) {
    if (!item.value().requires_grad()) continue;
    (item.value().dim() >= 2 ? decay : no_decay).emplace_back(item.key(), item.value());
  }
  at::NoGradGuard no_grad;
  for (auto* members : {&decay, &no_decay}) {
    if (members->empty()) continue;
    FlatGroup g;
    g.weight_decay = members == &decay ? weight_decay : 0.0;
    int64_t total = 0;
    for (auto& [name, p] : *members) total += p.numel();
    const auto& first = members->front().second;
    g.params = at::empty({total}, first.options());
    g.grads = at::zeros({total}, first.options());
    int64_t offset = 0;
    for (auto& [name, p] : *members) {
      const int64_t n = p.numel();
      auto view = g.params.narrow(0, offset, n).view(p.sizes());
      view.copy_(p);
      p.set_data(view);
      p.mutable_grad() = g.grads.narrow(0, offset, n).view(p.sizes());
      g.segments.push_back({name, offset, n, p.sizes().vec()});
      offset += n;
    }
    groups_.push_back(std::move(g));
  }
}

void FlatParams::zero_grad() {
  for (auto& g : groups_) g.grads.zero_();
}

double FlatParams::clip_grad_norm(double max_norm) {
  double sq = 0;
  for (auto& g : groups_) {
    double n = g.grads.norm().item<double>();
    sq += n * n;
  }
  const double norm = std::sqrt(sq);
  if (max_norm > 0 && norm > max_norm) {
    const double scale = max_norm / (norm + 1e-6);   // torch.nn.utils.clip_grad_norm_'s rule
    for (auto& g : groups_) g.grads.mul_(scale);
  }
  return norm;
}

int64_t FlatParams::numel() const {
  int64_t n = 0;
  for (const auto& g : groups_) n += g.params.numel();
  return n;
}

}  // namespace colossal::optim
