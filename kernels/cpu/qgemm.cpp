// Quantized GEMM for prompts, CPU: see qgemm.h. This file quantizes the x rows once and splits the
// output columns, in whole tiles, across the threads; the set's copy (qgemm_isa.cpp) packs and
// multiplies one tile at a time.
#include "kernels/cpu/qgemm.h"

#include <algorithm>
#include <omp.h>
#include <vector>

#include "kernels/cpu/isa_kernels.h"
#include "kernels/cpu/qgemv.h"

namespace colossal::kernels {
namespace {

void run(const float* x, int64_t rows, int64_t in, const void* q, bool int4, const float* scales, int64_t group,
         const float* bias, float* y, int64_t out) {
  const IsaKernels& k = active_kernels();
  // x quantized as the GEMV quantizes it, in buffers this thread keeps, with each block's integer sum.
  thread_local std::vector<int8_t> xq;
  thread_local std::vector<uint8_t> xa;
  thread_local std::vector<float> xs, xc;
  thread_local std::vector<int32_t> xsum;
  const auto n = static_cast<size_t>(rows * in), blocks = n / kQ8Block;
  if (xq.size() < n) xq.resize(n), xa.resize(n);
  if (xs.size() < blocks) xs.resize(blocks), xc.resize(blocks), xsum.resize(blocks);
  k.quantize_rows_q8(x, static_cast<int64_t>(blocks), xq.data(), xa.data(), xs.data(), xc.data());
  for (size_t b = 0; b < blocks; ++b) {
    int32_t s = 0;
    for (int64_t i = 0; i < kQ8Block; ++i) s += xq[b * kQ8Block + i];
    xsum[b] = s;
  }
  const QgemmProblem p{xq.data(), xs.data(), xsum.data(), rows, in, q, int4, scales, group, bias, y, out};
  const int64_t tiles = (out + kQgemmColumns - 1) / kQgemmColumns;
#pragma omp parallel if (tiles > 1)
  {
    const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t per = (tiles + threads - 1) / threads;
    const int64_t begin = std::min(t * per, tiles) * kQgemmColumns, end = std::min((t + 1) * per * kQgemmColumns, out);
    if (begin < end) {
      thread_local std::vector<uint8_t> scratch;
      const auto need = static_cast<size_t>(qgemm_scratch_bytes(in, group));
      if (scratch.size() < need) scratch.resize(need);
      k.qgemm_columns(p, begin, end, scratch.data());
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
