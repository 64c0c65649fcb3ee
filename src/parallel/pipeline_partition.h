// Cutting a model's blocks into pipeline stages: contiguous ranges, one a virtual stage, every stage
// at least one block. `uniform` gives every stage the same number of blocks (the first ones one more
// when they do not divide); balanced partitions minimise the costliest stage, where a stage costs the
// sum of its blocks plus what it holds besides them (the embedding on the first stage, the head on the
// last): by parameters (memory) or by measured time.
#pragma once
#include <cstdint>
#include <vector>

namespace colossal::parallel {

// Boundaries b[0] = 0 < b[1] < ... < b[stages] = blocks: stage s runs blocks [b[s], b[s + 1]).
std::vector<int64_t> uniform_partition(int64_t blocks, int64_t stages);
// `block_cost[i]` per block; `first_extra`, `last_extra`: the first and the last stage's other cost.
std::vector<int64_t> balanced_partition(const std::vector<double>& block_cost, double first_extra, double last_extra, int64_t stages);

}  // namespace colossal::parallel
