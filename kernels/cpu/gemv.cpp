// Decoding GEMV, CPU: see gemv.h. The outputs are split into contiguous ranges, one per thread, each
// running the active instruction set's loop (gemv_isa.cpp).
#include "kernels/cpu/gemv.h"

#include <algorithm>
#include <omp.h>

#include "kernels/cpu/isa_kernels.h"

namespace colossal::kernels {
namespace {

// run(begin, end) on each thread's range of the `out` outputs, in whole 16-output groups: with W, each
// thread streams its own stretch of rows; with W^T, its own stretch of every row. Below ~256 KiB of
// weights the pool's wake-up costs more than a second core saves.
template <class Run>
void split_outputs(int64_t out, int64_t in, const Run& run) {
#pragma omp parallel if (out * in >= (1 << 16))
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
  split_outputs(out, in, [&](int64_t begin, int64_t end) { f(x, rows, in, w, bias, y, out, begin, end); });
}

void gemv_t(const float* x, int64_t rows, int64_t in, const float* wt, const float* bias, float* y, int64_t out) {
  const auto f = active_kernels().gemv_t;
  split_outputs(out, in, [&](int64_t begin, int64_t end) { f(x, rows, in, wt, out, bias, y, out, begin, end); });
}

}  // namespace colossal::kernels
