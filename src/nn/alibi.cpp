// ALiBi slopes and bias: see alibi.h.
#include "src/nn/alibi.h"

#include <ATen/ATen.h>
#include <cmath>
#include <limits>
#include <vector>

namespace colossal::nn {

at::Tensor alibi_slopes(int64_t heads) {
  int64_t n = 1;
  while (n * 2 <= heads) n *= 2;
  std::vector<float> slopes;
  for (int64_t i = 1; i <= n; ++i) slopes.push_back(static_cast<float>(std::pow(2.0, -8.0 * static_cast<double>(i) / static_cast<double>(n))));
  for (int64_t i = 1; static_cast<int64_t>(slopes.size()) < heads; i += 2)
    slopes.push_back(static_cast<float>(std::pow(2.0, -8.0 * static_cast<double>(i) / static_cast<double>(2 * n))));
  return at::tensor(slopes, at::kFloat);
}

at::Tensor alibi_bias(const at::Tensor& slopes, int64_t t, int64_t offset, int64_t s, const at::Tensor& allowed, bool causal) {
  return alibi_bias(slopes, at::arange(offset, offset + t, slopes.options()), s, allowed, causal);
}

at::Tensor alibi_bias(const at::Tensor& slopes, const at::Tensor& query_positions, int64_t s, const at::Tensor& allowed, bool causal) {
  const auto distance = at::arange(s, slopes.options()).view({1, s}) - query_positions.to(slopes.scalar_type()).view({-1, 1});   // [T, S]
  auto bias = (slopes.view({-1, 1, 1}) * distance).unsqueeze(0);                                              // [1, H, T, S]
  const float blocked = -std::numeric_limits<float>::infinity();
  if (allowed.defined()) return bias.masked_fill(allowed.logical_not(), blocked);   // [B, H, T, S]
  return causal ? bias.masked_fill(distance > 0, blocked) : bias;
}

at::Tensor alibi_bias_at(const at::Tensor& slopes, const at::Tensor& qpos, const at::Tensor& kpos, bool causal) {
  const auto distance = (kpos.view({1, -1}) - qpos.view({-1, 1})).to(slopes.scalar_type());   // [Tq, Tk]
  auto bias = slopes.view({-1, 1, 1}) * distance;                                              // [H, Tq, Tk]
  return causal ? bias.masked_fill(distance.gt(0), -std::numeric_limits<float>::infinity()) : bias;
}

}  // namespace colossal::nn
