// How the decoding GEMVs (gemv.cpp, qgemv.cpp) share a weight's output rows among the threads. Included
// only by files compiled with OpenMP.
#pragma once
#include <algorithm>
#include <cstdint>
#include <omp.h>

#include "kernels/cpu/stretches.h"

namespace colossal::kernels {

// run(begin, end) over ranges of whole 16-row groups of the `out` output rows, all of them covered
// once. Each thread streams its own stretch of rows and the first done takes groups from the others'
// ends (stretches.h): on a 2-core AMD EPYC Zen 3 one core streamed 10-18% slower than the other for
// whole runs, and OpenMP's guided schedule, which hands the first thread half the rows in one piece,
// left the faster one spinning at every product's end. An output's bits do not depend on which thread
// computes it. `parallel` false runs them all on the calling thread (a weight small enough that waking
// the pool costs more than a second core saves).
template <class Run>
void for_row_groups(int64_t out, bool parallel, const Run& run) {
  const int64_t groups = (out + 15) / 16;
  const int threads = parallel && groups > 1 ? omp_get_max_threads() : 1;
  if (threads == 1) {
    if (out > 0) run(0, out);
    return;
  }
  thread_local Stretches kept;
  Stretches& share = kept;   // the calling thread's: inside the region, `kept` would name each thread's own
  share.reset(groups, threads);
#pragma omp parallel num_threads(threads)
  share.work(omp_get_thread_num(), [&](int64_t b, int64_t e) { run(b * 16, std::min(out, e * 16)); });
}

}  // namespace colossal::kernels
