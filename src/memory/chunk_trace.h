// ChunkAccessTrace: the order in which a training step uses its chunks, recorded once and then replayed.
// Every step runs the same blocks in the same order (forward 0..L-1, backward L-1..0, per micro-batch),
// so the step's sequence of block visits repeats, and with it the moment each chunk is next needed.
// Gemini's placement evicts by it: of the gathered chunks it may drop, the one whose next use is
// furthest away goes first (Belady's rule, optimal for a known sequence; exact here because the
// sequence is measured, where Colossal-AI estimates it). With a memory budget that is what keeps the
// most re-gathering off the step.
#pragma once
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

namespace colossal::memory {

class ChunkAccessTrace {
 public:
  struct Visit {
    int64_t block = 0;
    int direction = +1;           // +1 forward, -1 backward
    std::vector<int64_t> chunks;  // the chunks it needs gathered
  };
  static constexpr int64_t kNever = std::numeric_limits<int64_t>::max();

  // While recording (the first step): the next visit of the step.
  void record(int64_t block, int direction, std::vector<int64_t> chunks);
  // The step's sequence is complete; from here it repeats.
  void close(int64_t chunks);
  bool closed() const { return closed_; }
  size_t size() const { return visits_.size(); }
  const Visit& visit(size_t i) const { return visits_[i]; }
  const std::vector<Visit>& visits() const { return visits_; }

  // The index of the first visit of (block, direction) at or after `from`, wrapping into the next step
  // (an evaluation's forward visits land on the step's forward ones); none if the step never visits it.
  std::optional<size_t> find(int64_t block, int direction, size_t from) const;
  // Visits from `now` to chunk c's next use after it (1: the very next visit; the sequence repeats, so
  // a chunk used only earlier in the step is next used in the next step); kNever if no visit uses it.
  int64_t distance_to_next_use(int64_t chunk, size_t now) const;
  // `candidates` in the order to evict them at visit `now`: furthest next use first, ties by chunk index.
  std::vector<int64_t> eviction_order(std::vector<int64_t> candidates, size_t now) const;
  // The visits of one step that gather chunk c (0 for a chunk no block visit gathers: one held whole).
  int64_t gathers_per_step(int64_t chunk) const;

 private:
  std::vector<Visit> visits_;
  std::vector<std::vector<size_t>> uses_;   // by chunk: the visits that use it, ascending
  bool closed_ = false;
};

// Gemini's auto plan moves chunks' data to the device in this order: the most host-device traffic a
// step saves per byte of device memory first (ties by index). `saved[c]` is what chunk c's data
// crosses the bus per step while it lives on the host, `moved[c]` what it takes on the device; a chunk
// with nothing to move comes last.
std::vector<int64_t> placement_order(const std::vector<int64_t>& saved, const std::vector<int64_t>& moved);

}  // namespace colossal::memory
