// Shared optimizer helpers: see optimizer.h.
#include "src/optim/optimizer.h"

#include <ATen/ATen.h>

namespace colossal::optim {

at::Tensor squared_norms(const std::vector<ParamPiece>& pieces, const StepContext& ctx,
                         const std::function<at::Tensor(const ParamPiece&)>& of) {
  at::Tensor sums = at::zeros({ctx.tensors}, at::kDouble);
  if (!pieces.empty()) {
    // One norm per piece on its device, brought to the host in one transfer.
    std::vector<at::Tensor> norms;
    for (const auto& p : pieces) norms.push_back(at::linalg_vector_norm(of(p), 2, c10::nullopt, false, at::kDouble));
    const at::Tensor host = at::stack(norms).cpu();
    auto* s = sums.data_ptr<double>();
    const auto* n = host.data_ptr<double>();
    for (size_t i = 0; i < pieces.size(); ++i) s[pieces[i].tensor] += n[i] * n[i];
  }
  ctx.sum_across_shards(sums);
  return sums;
}

}  // namespace colossal::optim
