// Pipeline partitions: see pipeline_partition.h.
#include "src/parallel/pipeline_partition.h"

#include <algorithm>
#include <limits>
#include <string>

#include "src/core/error.h"

namespace colossal::parallel {
namespace {

void check(int64_t blocks, int64_t stages) {
  if (stages < 1 || blocks < stages)
    throw Error(std::to_string(blocks) + " blocks cannot be cut into " + std::to_string(stages) +
                " pipeline stages of at least one block each (use at most " + std::to_string(blocks) + " stages)");
}

}  // namespace

std::vector<int64_t> uniform_partition(int64_t blocks, int64_t stages) {
  check(blocks, stages);
  std::vector<int64_t> b{0};
  for (int64_t s = 0; s < stages; ++s) b.push_back(b.back() + blocks / stages + (s < blocks % stages ? 1 : 0));
  return b;
}

std::vector<int64_t> balanced_partition(const std::vector<double>& cost, double first_extra, double last_extra, int64_t stages) {
  const auto n = static_cast<int64_t>(cost.size());
  check(n, stages);
  std::vector<double> prefix(static_cast<size_t>(n) + 1, 0);
  for (int64_t i = 0; i < n; ++i) prefix[static_cast<size_t>(i) + 1] = prefix[static_cast<size_t>(i)] + cost[static_cast<size_t>(i)];
  auto stage_cost = [&](int64_t s, int64_t from, int64_t to) {
    return prefix[static_cast<size_t>(to)] - prefix[static_cast<size_t>(from)] + (s == 0 ? first_extra : 0) + (s == stages - 1 ? last_extra : 0);
  };
  constexpr double kInf = std::numeric_limits<double>::infinity();
  // best[s][i]: the least largest cost of the first s stages covering blocks [0, i); cut[s][i] its last cut.
  std::vector<std::vector<double>> best(static_cast<size_t>(stages) + 1, std::vector<double>(static_cast<size_t>(n) + 1, kInf));
  std::vector<std::vector<int64_t>> cut(best.size(), std::vector<int64_t>(static_cast<size_t>(n) + 1, 0));
  best[0][0] = 0;
  for (int64_t s = 1; s <= stages; ++s)
    for (int64_t i = s; i <= n - (stages - s); ++i)
      for (int64_t j = s - 1; j < i; ++j) {
        const double c = std::max(best[static_cast<size_t>(s) - 1][static_cast<size_t>(j)], stage_cost(s - 1, j, i));
        if (c < best[static_cast<size_t>(s)][static_cast<size_t>(i)]) {
          best[static_cast<size_t>(s)][static_cast<size_t>(i)] = c;
          cut[static_cast<size_t>(s)][static_cast<size_t>(i)] = j;
        }
      }
  std::vector<int64_t> b(static_cast<size_t>(stages) + 1, 0);
  b[static_cast<size_t>(stages)] = n;
  for (int64_t s = stages; s > 0; --s) b[static_cast<size_t>(s) - 1] = cut[static_cast<size_t>(s)][static_cast<size_t>(b[static_cast<size_t>(s)])];
  return b;
}

}  // namespace colossal::parallel
