// Dense GEMM, CPU: see gemm.h. C's rows are split into contiguous ranges, one per thread, each running
// the active instruction set's row loop (gemm_isa.cpp) over the whole of B.
#include "kernels/cpu/gemm.h"

#include <algorithm>
#include <omp.h>

#include "kernels/cpu/isa_kernels.h"
#include "kernels/cpu/thread_scratch.h"

namespace colossal::kernels {

void gemm(const GemmProblem& p) {
  const auto& k = active_kernels();
  const int64_t tiles = (p.rows + k.gemm_tile_rows - 1) / k.gemm_tile_rows;
  // Below ~4 MFLOP a second thread's wake-up costs about what it saves.
#pragma omp parallel if (p.rows * p.cols * p.depth >= (1 << 21) && tiles > 1)
  {
    // Whole tiles, as evenly as they divide: 128 rows in 24-row grains gave one thread 72 and the other 56.
    const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t begin = std::min(p.rows, tiles * t / threads * k.gemm_tile_rows);
    const int64_t end = std::min(p.rows, tiles * (t + 1) / threads * k.gemm_tile_rows);
    if (begin < end) k.gemm_rows(p, begin, end, thread_scratch(kGemmScratchFloats));
  }
}

}  // namespace colossal::kernels
