// How the decoding GEMVs (gemv.cpp, qgemv.cpp) share a weight's output rows among the threads. Included
// only by files compiled with OpenMP.
#pragma once
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <omp.h>

namespace colossal::kernels {

// A thread's stretch of 16-row groups, [front, back), taken from the front by its owner and from the
// back by threads that finished their own. One 64-bit word, so both ends move by compare-and-swap.
struct alignas(64) RowGroupRange {
  std::atomic<uint64_t> bounds;   // front in the low 32 bits, back in the high 32

  static uint64_t pack(uint64_t front, uint64_t back) { return back << 32 | front; }
  void reset(int64_t front, int64_t back) { bounds.store(pack(front, back), std::memory_order_relaxed); }

  // The group taken, or -1 when the stretch is empty.
  int64_t take(bool from_back) {
    uint64_t b = bounds.load(std::memory_order_relaxed);
    for (;;) {
      const uint64_t front = b & 0xffffffffu, back = b >> 32;
      if (front >= back) return -1;
      const uint64_t next = from_back ? pack(front, back - 1) : pack(front + 1, back);
      if (bounds.compare_exchange_weak(b, next, std::memory_order_relaxed)) return static_cast<int64_t>(from_back ? back - 1 : front);
    }
  }
};

// run(begin, end) over ranges of whole 16-row groups of the `out` output rows, all of them covered
// once. Each thread starts on its own equal stretch, one sequential stream of rows, and a thread that
// finishes takes the others' last groups, one at a time from the back, until none is left. OpenMP's
// guided schedule did that worse: its first piece is half of all rows, so when the thread holding it
// streamed slower (on a 2-core AMD EPYC Zen 3 one core often did), the other waited 20-70 us at the
// end of every GEMV (a step has 49), where this ends within 7-11 us, one group's time. An output's
// bits do not depend on which thread computes it. `parallel` false runs them all on the calling thread
// (a weight small enough that waking the pool costs more than a second core saves).
template <class Run>
void for_row_groups(int64_t out, bool parallel, const Run& run) {
  const int64_t groups = (out + 15) / 16;
  const int threads = omp_get_max_threads();
  if (!parallel || groups < 2 || threads < 2 || omp_in_parallel()) {
    if (out > 0) run(0, out);
    return;
  }
  std::unique_ptr<RowGroupRange[]> ranges(new RowGroupRange[threads]);
  for (int t = 0; t < threads; ++t) ranges[t].reset(groups * t / threads, groups * (t + 1) / threads);
#pragma omp parallel num_threads(threads)
  {
    // Its own stretch, then every other (one the runtime gave no thread to as well) from the back.
    const int t = omp_get_thread_num();
    for (int k = 0; k < threads; ++k) {
      RowGroupRange& r = ranges[(t + k) % threads];
      for (int64_t g; (g = r.take(k > 0)) >= 0;) run(g * 16, std::min(out, g * 16 + 16));
    }
  }
}

}  // namespace colossal::kernels
