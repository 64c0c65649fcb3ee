// Chunk layout and chunk-size search: see chunk_layout.h.
#include "src/memory/chunk_layout.h"

#include <algorithm>
#include <numeric>
#include <set>

#include "src/core/error.h"

namespace colossal::memory {
namespace {

int64_t numel_of(const std::vector<int64_t>& shape) {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
}
int64_t round_up(int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

}  // namespace

int64_t ChunkLayout::total_numel() const { return std::accumulate(chunk_sizes.begin(), chunk_sizes.end(), int64_t{0}); }

int64_t ChunkLayout::padding() const {
  int64_t used = 0;
  for (const auto& s : slots) used += s.numel;
  return total_numel() - used;
}

ChunkLayout plan_chunks(const std::vector<ChunkTensorSpec>& tensors, int64_t chunk_numel, int64_t shards) {
  if (shards < 1 || chunk_numel < 1) throw Error("chunk layout: chunk size and shard count must be positive (internal)");
  ChunkLayout l;
  l.shards = shards;
  const int64_t unit = kAlign * shards;
  l.chunk_numel = round_up(chunk_numel, unit);
  int64_t used = 0;   // elements taken in the open chunk (the last one)
  auto open = [&](int64_t size) {
    l.chunk_sizes.push_back(size);
    l.chunk_slots.emplace_back();
    used = 0;
  };
  for (const auto& t : tensors) {
    ChunkSlot s{t.name, t.shape, numel_of(t.shape), t.decay, 0, 0};
    if (s.numel > l.chunk_numel) {
      open(round_up(s.numel, unit));   // a chunk of its own, closed at once
      used = l.chunk_sizes.back();
    } else {
      if (l.chunk_sizes.empty() || used + s.numel > l.chunk_sizes.back()) open(l.chunk_numel);
      s.offset = used;
      used += s.numel;
    }
    s.chunk = l.chunks() - 1;
    l.chunk_slots.back().push_back(static_cast<int64_t>(l.slots.size()));
    l.slots.push_back(std::move(s));
  }
  // The last chunk ends where its tensors do: nothing follows to fill its tail.
  if (!l.chunk_sizes.empty() && l.chunk_sizes.back() == l.chunk_numel) l.chunk_sizes.back() = round_up(used, unit);
  return l;
}

int64_t search_chunk_numel(const std::vector<ChunkTensorSpec>& tensors, int64_t lo, int64_t hi, int64_t step, int64_t shards) {
  // Candidates: the stepped range, plus every run of consecutive tensors that starts near the front and
  // fits the range (a chunk exactly one or two blocks long wastes nothing; a stepped size rarely hits it).
  std::set<int64_t> candidates;
  for (int64_t size = lo; size <= hi; size += std::max<int64_t>(step, 1)) candidates.insert(size);
  constexpr size_t kStarts = 64;
  for (size_t i = 0; i < std::min(kStarts, tensors.size()); ++i) {
    int64_t run = 0;
    for (size_t j = i; j < tensors.size() && run <= hi; ++j) {
      run += numel_of(tensors[j].shape);
      if (run >= lo && run <= hi) candidates.insert(run);
    }
  }
  int64_t best = lo, best_waste = -1;
  for (int64_t size : candidates) {
    const int64_t waste = plan_chunks(tensors, size, shards).padding();
    if (best_waste < 0 || waste < best_waste) {
      best = size;
      best_waste = waste;
    }
  }
  return round_up(best, kAlign * shards);
}

int64_t choose_chunk_numel(const std::vector<ChunkTensorSpec>& tensors, double chunk_mb, int64_t shards, int stage) {
  if (chunk_mb > 0) return std::max<int64_t>(1, static_cast<int64_t>(chunk_mb * 1024 * 1024 / 4));
  int64_t total = 0;
  for (const auto& t : tensors) total += numel_of(t.shape);
  // The upper end may pass 64M elements for models of several billion parameters, whose blocks alone are
  // tens of millions: capped there, a 5.7B GPT (blocks of 50M) had no candidate size near a block or two,
  // and a third of its chunks' elements were padding, on the disk too under parameter offload.
  const int64_t lo = std::clamp<int64_t>(total / 64, 64 * 1024, 64 << 20);
  const int64_t hi = std::clamp<int64_t>(total / (stage == 3 ? 32 : 8), lo, 256 << 20);
  return search_chunk_numel(tensors, lo, hi, std::max<int64_t>((hi - lo) / 128, kAlign), shards);
}

}  // namespace colossal::memory
