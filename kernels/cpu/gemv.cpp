// Decoding GEMV, CPU: see gemv.h. Output rows are split into contiguous ranges, one per thread, each
// running the active instruction set's loop (gemv_isa.cpp).
#include "kernels/cpu/gemv.h"

#include <omp.h>

#include "kernels/cpu/isa_kernels.h"

namespace colossal::kernels {

void gemv(const float* x, int64_t rows, int64_t in, const float* w, const float* bias, float* y, int64_t out) {
  const auto f = active_kernels().gemv;
  // Below ~256 KiB of weights the pool's wake-up costs more than a second core saves.
  const bool parallel = out * in >= (1 << 16) && omp_get_max_threads() > 1;
#pragma omp parallel if (parallel)
  {
    const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
    // Ranges in whole 16-row groups so each thread streams its own stretch of W.
    const int64_t groups = (out + 15) / 16, per = (groups + threads - 1) / threads;
    const int64_t begin = t * per * 16 < out ? t * per * 16 : out;
    const int64_t end = (t + 1) * per * 16 < out ? (t + 1) * per * 16 : out;
    if (begin < end) f(x, rows, in, w, bias, y, out, begin, end);
  }
}

}  // namespace colossal::kernels
