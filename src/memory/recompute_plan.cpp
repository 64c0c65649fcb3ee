// Recompute planning: see recompute_plan.h.
#include "src/memory/recompute_plan.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace colossal::memory {

int64_t RecomputePlan::count() const { return std::count(recompute.begin(), recompute.end(), true); }

double activation_peak(const std::vector<BlockActivation>& blocks, const std::vector<bool>& recompute) {
  double before = 0, peak = 0;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const bool r = i < recompute.size() && recompute[i];
    if (r) peak = std::max(peak, before + blocks[i].kept);   // its rerun in backward
    before += r ? blocks[i].output : blocks[i].kept;
  }
  return std::max(peak, before);
}

namespace {

constexpr int64_t kUnits = 4096;   // the budget's resolution: costs rounded up to a 1/4096th of it

}  // namespace

RecomputePlan plan_recompute(const std::vector<BlockActivation>& blocks, double budget) {
  const auto n = blocks.size();
  RecomputePlan plan;
  if (budget <= 0) return plan;
  const double unit = budget / kUnits;
  auto units = [&](double bytes) { return static_cast<int64_t>(std::ceil(bytes / unit - 1e-9)); };
  constexpr double kInf = std::numeric_limits<double>::infinity();
  // best[i][m]: the least recompute time over the first i blocks leaving m units held; how[i][m]: whether
  // block i - 1 was recomputed to get there.
  std::vector<std::vector<double>> best(n + 1, std::vector<double>(kUnits + 1, kInf));
  std::vector<std::vector<char>> how(n + 1, std::vector<char>(kUnits + 1, 0));
  best[0][0] = 0;
  for (size_t i = 0; i < n; ++i) {
    const int64_t kept = units(blocks[i].kept), out = units(blocks[i].output);
    for (int64_t m = 0; m <= kUnits; ++m) {
      const double t = best[i][static_cast<size_t>(m)];
      if (t == kInf || m + kept > kUnits) continue;   // a kept block, or a recomputed one's rerun, needs m + kept
      if (t < best[i + 1][static_cast<size_t>(m + kept)]) {
        best[i + 1][static_cast<size_t>(m + kept)] = t;
        how[i + 1][static_cast<size_t>(m + kept)] = 0;
      }
      const double tr = t + blocks[i].forward_s;
      if (m + out <= kUnits && tr < best[i + 1][static_cast<size_t>(m + out)]) {
        best[i + 1][static_cast<size_t>(m + out)] = tr;
        how[i + 1][static_cast<size_t>(m + out)] = 1;
      }
    }
  }
  int64_t end = -1;
  for (int64_t m = 0; m <= kUnits; ++m)
    if (best[n][static_cast<size_t>(m)] < kInf && (end < 0 || best[n][static_cast<size_t>(m)] < best[n][static_cast<size_t>(end)])) end = m;
  if (end < 0) return plan;
  plan.recompute.assign(n, false);
  for (size_t i = n; i > 0; --i) {
    const bool r = how[i][static_cast<size_t>(end)];
    plan.recompute[i - 1] = r;
    end -= r ? units(blocks[i - 1].output) : units(blocks[i - 1].kept);
  }
  plan.peak = activation_peak(blocks, plan.recompute);
  plan.kept_whole = activation_peak(blocks, std::vector<bool>(n, false));
  for (size_t i = 0; i < n; ++i) plan.seconds += plan.recompute[i] ? blocks[i].forward_s : 0;
  return plan;
}

double smallest_budget(const std::vector<BlockActivation>& blocks) {
  // Fitting is monotone in the budget: bisect between the largest block's rerun (no plan does with
  // less) and keeping everything (always fits), to a part in a thousand.
  double lo = 0, hi = activation_peak(blocks, std::vector<bool>(blocks.size(), false));
  for (const auto& b : blocks) lo = std::max(lo, std::min(b.kept, b.output));
  for (int k = 0; k < 60 && hi - lo > 1e-3 * hi; ++k) {
    const double mid = 0.5 * (lo + hi);
    (plan_recompute(blocks, mid).recompute.empty() ? lo : hi) = mid;
  }
  return hi;
}

}  // namespace colossal::memory
