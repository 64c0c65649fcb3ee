// Decoding GEMV, CPU: see gemv.h. The outputs are split into ranges among the threads, each running
// the active instruction set's loop (gemv_isa.cpp): W's rows as the threads finish (row_groups.h), W^T's
// columns one fixed stretch per thread.
#include "kernels/cpu/gemv.h"

#include <algorithm>
#include <omp.h>

#include "kernels/cpu/isa_kernels.h"
#include "kernels/cpu/row_groups.h"

namespace colossal::kernels {
namespace {

// Below ~256 KiB of weights the pool's wake-up costs more than a second core saves.
bool worth_threads(int64_t out, int64_t in) { return out * in >= (1 << 16); }

// run(begin, end) on each thread's range of the `out` outputs, in whole 16-output groups: with W^T,
// each thread streams its own stretch of every row, which pieces handed out as threads finish would
// cut into ever shorter streams.
template <class Run>
void split_columns(int64_t out, int64_t in, const Run& run) {
#pragma omp parallel if (worth_threads(out, in))
  {
    const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t per = ((out + 15) / 16 + threads - 1) / threads * 16;
    const int64_t begin = std::min(t * per, out), end = std::min(begin + per, out);
    if (begin < end) run(begin, end);
  }
}

}  // namespace

void gemv(const float* x, int64_t rows, int64_t in, const float* w, const float* bias, float* y, int64_t out) {
  const auto f = active_kernels().gemv;
  for_row_groups(out, worth_threads(out, in), [&](int64_t begin, int64_t end) { f(x, rows, in, w, bias, y, out, begin, end); });
}

void gemv_t(const float* x, int64_t rows, int64_t in, const float* wt, const float* bias, float* y, int64_t out) {
  const auto f = active_kernels().gemv_t;
  split_columns(out, in, [&](int64_t begin, int64_t end) { f(x, rows, in, wt, out, bias, y, out, begin, end); });
}

}  // namespace colossal::kernels
