// Shared optimizer helpers: see optimizer.h.
#include "src/optim/optimizer.h"

#include <ATen/ATen.h>

namespace colossal::optim {

at::Tensor squared_norms(const std::vector<ParamPiece>& pieces, const StepContext& ctx, const std::vector<PieceValue>& of) {
  const auto quantities = static_cast<int64_t>(of.size());
  at::Tensor sums = at::zeros({quantities, ctx.tensors}, at::kDouble);
  if (!pieces.empty()) {
    // One norm per piece and quantity on its device, brought to the host in one transfer.
    std::vector<at::Tensor> norms;
    for (const auto& value : of)
      for (size_t i = 0; i < pieces.size(); ++i) norms.push_back(at::linalg_vector_norm(value(i), 2, c10::nullopt, false, at::kDouble));
    const at::Tensor host = at::stack(norms).cpu();
    auto* s = sums.data_ptr<double>();
    const auto* n = host.data_ptr<double>();
    for (int64_t k = 0; k < quantities; ++k)
      for (size_t i = 0; i < pieces.size(); ++i) {
        const double x = n[static_cast<size_t>(k) * pieces.size() + i];
        s[k * ctx.tensors + pieces[i].tensor] += x * x;
      }
  }
  ctx.sum_across_shards(sums);
  return sums;
}

}  // namespace colossal::optim
