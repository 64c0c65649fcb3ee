// Chunk access trace: see chunk_trace.h.
#include "src/memory/chunk_trace.h"

#include <algorithm>
#include <numeric>

#include "src/core/error.h"

namespace colossal::memory {

void ChunkAccessTrace::record(int64_t block, int direction, std::vector<int64_t> chunks) {
  if (closed_) throw Error("chunk trace: recording after close (internal)");
  visits_.push_back({block, direction, std::move(chunks)});
}

void ChunkAccessTrace::close(int64_t chunks) {
  uses_.assign(static_cast<size_t>(chunks), {});
  for (size_t v = 0; v < visits_.size(); ++v)
    for (int64_t c : visits_[v].chunks) {
      if (c < 0 || c >= chunks) throw Error("chunk trace: chunk " + std::to_string(c) + " of " + std::to_string(chunks) + " (internal)");
      auto& u = uses_[static_cast<size_t>(c)];
      if (u.empty() || u.back() != v) u.push_back(v);
    }
  closed_ = true;
}

std::optional<size_t> ChunkAccessTrace::find(int64_t block, int direction, size_t from) const {
  const size_t n = visits_.size();
  for (size_t k = 0; k < n; ++k) {
    const size_t v = (from + k) % n;
    if (visits_[v].block == block && visits_[v].direction == direction) return v;
  }
  return std::nullopt;
}

int64_t ChunkAccessTrace::distance_to_next_use(int64_t chunk, size_t now) const {
  if (chunk < 0 || static_cast<size_t>(chunk) >= uses_.size()) return kNever;
  const auto& u = uses_[static_cast<size_t>(chunk)];
  if (u.empty()) return kNever;
  const auto next = std::upper_bound(u.begin(), u.end(), now);
  const auto n = static_cast<int64_t>(visits_.size());
  if (next != u.end()) return static_cast<int64_t>(*next) - static_cast<int64_t>(now);
  return static_cast<int64_t>(u.front()) + n - static_cast<int64_t>(now);   // in the next step
}

std::vector<int64_t> ChunkAccessTrace::eviction_order(std::vector<int64_t> candidates, size_t now) const {
  std::stable_sort(candidates.begin(), candidates.end(), [&](int64_t a, int64_t b) {
    const int64_t da = distance_to_next_use(a, now), db = distance_to_next_use(b, now);
    return da != db ? da > db : a < b;
  });
  return candidates;
}

int64_t ChunkAccessTrace::gathers_per_step(int64_t chunk) const {
  return chunk >= 0 && static_cast<size_t>(chunk) < uses_.size() ? static_cast<int64_t>(uses_[static_cast<size_t>(chunk)].size()) : 0;
}

std::vector<int64_t> placement_order(const std::vector<int64_t>& saved, const std::vector<int64_t>& moved) {
  std::vector<int64_t> order(saved.size());
  std::iota(order.begin(), order.end(), int64_t{0});
  // saved[a] / moved[a] > saved[b] / moved[b], cross-multiplied (bytes times bytes can pass 2^63)
  const auto denser = [&](int64_t a, int64_t b) {
    const auto sa = static_cast<size_t>(a), sb = static_cast<size_t>(b);
    if ((moved[sa] == 0) != (moved[sb] == 0)) return moved[sb] == 0;
    return static_cast<__int128>(saved[sa]) * moved[sb] > static_cast<__int128>(saved[sb]) * moved[sa];
  };
  std::stable_sort(order.begin(), order.end(), denser);
  return order;
}

}  // namespace colossal::memory
