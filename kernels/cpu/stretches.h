// Items shared among the threads of a parallel region so that each works through long sequential runs
// and a slower core ends up with fewer items. Each thread owns one contiguous stretch of the items and
// takes them from its front; a thread whose stretch is done takes items from the backs of the others'.
//
// Why not OpenMP's schedules: on a 2-core AMD EPYC Zen 3 one core ran the same kernels 10-18% slower than
// the other for whole runs. Static halves left the faster core waiting that long at every stage's
// end; guided hands the first thread half of the items in one piece, so it balances no better; dynamic
// pieces interleave the two threads' weight streams, and an int4 decoding step's products then took 1.5x
// as long (a sequential stream per core is what the hardware prefetchers keep up with).
#pragma once
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

namespace colossal::kernels {

class Stretches {
 public:
  // Before the region: `items` among `threads` stretches (the region's thread count).
  void reset(int64_t items, int threads) {
    if (static_cast<int>(ends_.size()) < threads) ends_ = std::vector<Ends>(threads);
    threads_ = threads;
    for (int t = 0; t < threads; ++t)
      ends_[t].v.store(pack(items * t / threads, items * (t + 1) / threads), std::memory_order_relaxed);
  }

  // Inside the region, by thread `t` of the reset's count: run(begin, end) over the items it takes,
  // until none are left anywhere.
  template <class Run>
  void work(int t, const Run& run) {
    if (t >= threads_) return;
    for (int64_t b, e; take_front(t, b, e);) run(b, e);
    for (int k = 1; k < threads_; ++k) {
      const int s = (t + k) % threads_;
      for (int64_t b, e; take_back(s, b, e);) run(b, e);
    }
  }

 private:
  struct alignas(64) Ends {   // [front, back) of a stretch in one word, each end on its own cache line
    std::atomic<uint64_t> v{0};
  };
  static uint64_t pack(int64_t front, int64_t back) { return static_cast<uint64_t>(front) | static_cast<uint64_t>(back) << 32; }

  // A quarter of what is left of the own stretch (at least one item): few claims while it is long,
  // single items near the end, where another thread may be taking from the back.
  bool take_front(int s, int64_t& b, int64_t& e) {
    uint64_t v = ends_[s].v.load(std::memory_order_relaxed);
    for (;;) {
      const int64_t front = static_cast<int64_t>(v & 0xFFFFFFFFu), back = static_cast<int64_t>(v >> 32);
      if (front >= back) return false;
      const int64_t n = std::max<int64_t>(1, (back - front) / 4);
      if (ends_[s].v.compare_exchange_weak(v, pack(front + n, back), std::memory_order_acq_rel)) {
        b = front, e = front + n;
        return true;
      }
    }
  }
  bool take_back(int s, int64_t& b, int64_t& e) {
    uint64_t v = ends_[s].v.load(std::memory_order_relaxed);
    for (;;) {
      const int64_t front = static_cast<int64_t>(v & 0xFFFFFFFFu), back = static_cast<int64_t>(v >> 32);
      if (front >= back) return false;
      if (ends_[s].v.compare_exchange_weak(v, pack(front, back - 1), std::memory_order_acq_rel)) {
        b = back - 1, e = back;
        return true;
      }
    }
  }

  std::vector<Ends> ends_;
  int threads_ = 0;
};

}  // namespace colossal::kernels
