// Quantized decoding GEMV, CPU: see qgemv.h. Output rows are split into contiguous ranges, one per
// thread (as gemv.cpp does), each running the active instruction set's loop (qgemv_isa.cpp).
#include "kernels/cpu/qgemv.h"

#include <algorithm>
#include <omp.h>

#include "kernels/cpu/isa_kernels.h"

namespace colossal::kernels {
namespace {

template <class F>
void split_rows(int64_t out, int64_t bytes, const F& run) {
  // Below ~64 KiB of weights the pool's wake-up costs more than a second core saves.
#pragma omp parallel if (bytes >= (1 << 16))
  {
    const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t per = ((out + 15) / 16 + threads - 1) / threads * 16;   // whole 16-row groups
    const int64_t begin = std::min(t * per, out), end = std::min(begin + per, out);
    if (begin < end) run(begin, end);
  }
}

}  // namespace

void qgemv_int8(const float* x, int64_t rows, int64_t in, const int8_t* q, const float* scales, int64_t group,
                const float* bias, float* y, int64_t out) {
  const auto f = active_kernels().qgemv_int8;
  split_rows(out, out * in, [&](int64_t b, int64_t e) { f(x, rows, in, q, scales, group, bias, y, out, b, e); });
}

void qgemv_int4(const float* x, int64_t rows, int64_t in, const uint8_t* q, const float* scales, int64_t group,
                const float* bias, float* y, int64_t out) {
  const auto f = active_kernels().qgemv_int4;
  split_rows(out, out * in / 2, [&](int64_t b, int64_t e) { f(x, rows, in, q, scales, group, bias, y, out, b, e); });
}

}  // namespace colossal::kernels
