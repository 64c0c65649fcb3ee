// The 1D split check: see tensor_split.h.
#include "src/engine/tensor_split.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "models/registry.h"
#include "src/core/error.h"

namespace colossal {

void check_tensor_split(const ModelConfig& m, int64_t tp, const std::string& where) {
  std::vector<std::pair<std::string, int64_t>> dims{{"n_head", m.n_head}, {"n_inner", m.n_inner > 0 ? m.n_inner : 4 * m.n_embd}};
  if (model_task(m) != "image_classification") dims.emplace_back("vocab_size", m.vocab_size);
  auto divides_all = [&](int64_t t) {
    return std::all_of(dims.begin(), dims.end(), [t](const auto& d) { return d.second % t == 0; });
  };
  for (const auto& [key, n] : dims) {
    if (n % tp == 0) continue;
    std::string valid;
    for (int64_t t = 1; t <= std::min<int64_t>(m.n_head, 64); ++t)
      if (divides_all(t)) valid += (valid.empty() ? "" : ", ") + std::to_string(t);
    throw Error(where + " = " + std::to_string(tp) + " does not divide the model's " + key + " = " + std::to_string(n) +
                (key == "n_inner" && m.n_inner == 0 ? " (4 x n_embd)" : "") + " (tensor sizes that divide every split dimension: " +
                valid + ")");
  }
}

}  // namespace colossal
