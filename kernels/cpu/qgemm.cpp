// Quantized GEMM for prompts, CPU: see qgemm.h. This file quantizes the x rows once and splits the
// output columns, in whole tiles, across the threads; the set's copy (qgemm_isa.cpp) packs and
// multiplies one tile at a time.
#include "kernels/cpu/qgemm.h"

#include <algorithm>
#include <omp.h>

#include "kernels/cpu/isa_kernels.h"
#include "kernels/cpu/qgemv.h"
#include "kernels/cpu/quantized_rows.h"
#include "kernels/cpu/thread_scratch.h"

namespace colossal::kernels {
namespace {

void run(const float* x, int64_t rows, int64_t in, const void* q, bool int4, const float* scales, int64_t group,
         const float* bias, float* y, int64_t out) {
  const IsaKernels& k = active_kernels();
  const QuantizedRows& xr = quantize_rows(k, x, rows, in);   // as the GEMV quantizes them
  const QgemmProblem p{xr.q.data(), xr.s.data(), xr.sum.data(), rows, in, q, int4, scales, group, bias, y, out};
  const int64_t tiles = (out + kQgemmColumns - 1) / kQgemmColumns;
#pragma omp parallel if (tiles > 1)
  {
    const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t per = (tiles + threads - 1) / threads;
    const int64_t begin = std::min(t * per, tiles) * kQgemmColumns, end = std::min((t + 1) * per * kQgemmColumns, out);
    if (begin < end) {
      const auto floats = static_cast<size_t>((qgemm_scratch_bytes(in, group) + 3) / 4);
      k.qgemm_columns(p, begin, end, reinterpret_cast<uint8_t*>(thread_scratch(floats)));
    }
  }
}

}  // namespace

bool qgemm_available(int64_t in, int64_t group) { return active_kernels().qgemm_columns != nullptr && qgemv_integer_path(in, group); }

void qgemm_int8(const float* x, int64_t rows, int64_t in, const int8_t* q, const float* scales, int64_t group,
                const float* bias, float* y, int64_t out) {
  run(x, rows, in, q, false, scales, group, bias, y, out);
}

void qgemm_int4(const float* x, int64_t rows, int64_t in, const uint8_t* q, const float* scales, int64_t group,
                const float* bias, float* y, int64_t out) {
  run(x, rows, in, q, true, scales, group, bias, y, out);
}

}  // namespace colossal::kernels
