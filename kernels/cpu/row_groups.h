// How the decoding GEMVs (gemv.cpp, qgemv.cpp) share a weight's output rows among the threads. Included
// only by files compiled with OpenMP.
#pragma once
#include <algorithm>
#include <cstdint>
#include <omp.h>

namespace colossal::kernels {

// run(begin, end) over ranges of whole 16-row groups of the `out` output rows, all of them covered
// once. Threads take ranges as they finish (OpenMP's guided schedule: half the rows a thread at first,
// then ever smaller pieces), not one fixed half each: on a 2-core AMD EPYC Zen 3 one core streamed a
// few percent slower than the other, and with fixed halves the faster one spun at every step's end
// for 10% of its time. Each range is still one sequential stream of rows, and an output's bits do not
// depend on which thread computes it. `parallel` false runs them all on the calling thread (a weight
// small enough that waking the pool costs more than a second core saves).
template <class Run>
void for_row_groups(int64_t out, bool parallel, const Run& run) {
  const int64_t groups = (out + 15) / 16;
#pragma omp parallel for schedule(guided) if (parallel && groups > 1)
  for (int64_t g = 0; g < groups; ++g) run(g * 16, std::min(out, g * 16 + 16));
}

}  // namespace colossal::kernels
