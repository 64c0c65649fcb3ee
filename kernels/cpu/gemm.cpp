// Dense GEMM, CPU: see gemm.h. C is split among the threads, each running the active instruction set's
// loop (gemm_isa.cpp) over its part: contiguous ranges of whole row tiles, or, where there are too few
// tiles to share, ranges of columns.
#include "kernels/cpu/gemm.h"

#include <algorithm>
#include <omp.h>

#include "kernels/cpu/isa_kernels.h"
#include "kernels/cpu/thread_scratch.h"

namespace colossal::kernels {
namespace {

// Row tiles a thread needs before C's rows are split: fewer, and the threads split its columns instead.
// Each thread packs every B block its rows sweep, so a row split of a few rows packs all of B once per
// thread (a prompt of up to 6 rows on AVX2 had one thread pack and compute it all while the other
// waited), where a column split packs each block once and shares the work to a 16-column unit. Many
// rows the other way: each thread then reads all of A per panel, and at 1024 rows the training step's
// products ran slower that way (the weight gradient up to 1.7x). On an AMD EPYC Zen 3 (AVX2, 2 threads,
// GPT-2 124M's layer shapes, weights in cache) the column split took 3-12 rows from 0.62-1.59 ms to
// 0.29-0.80 ms and 24-96 rows 1.1-1.6x faster; from 16 tiles a thread the two were within this VM's
// noise. Whole prefills of that model (`colossal infer`, medians of 3): 6 tokens 93 -> 59 ms, 18 tokens
// 106 -> 85 ms, 84 tokens 200 -> 165 ms.
constexpr int64_t kRowSplitTiles = 8;

}  // namespace

void gemm(const GemmProblem& p) {
  const auto& k = active_kernels();
  const int64_t tiles = (p.rows + k.gemm_tile_rows - 1) / k.gemm_tile_rows;
  const int64_t units = p.cols / kGemmColumnMultiple;
  const int64_t pass_depth = k.gemm_pass_depth(p);
  // Below ~4 MFLOP a second thread's wake-up costs about what it saves.
#pragma omp parallel if (p.rows * p.cols * p.depth >= (1 << 21) && (tiles > 1 || units > 1))
  {
    const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
    if (tiles >= kRowSplitTiles * threads) {
      // Whole tiles, as evenly as they divide: 128 rows in 24-row grains gave one thread 72 and the other 56.
      const int64_t begin = std::min(p.rows, tiles * t / threads * k.gemm_tile_rows);
      const int64_t end = std::min(p.rows, tiles * (t + 1) / threads * k.gemm_tile_rows);
      if (begin < end) k.gemm_rows(p, begin, end, 0, p.cols, thread_scratch(gemm_scratch_floats(end - begin, pass_depth, p.a_depth != 1)));
    } else {
      const int64_t begin = units * t / threads * kGemmColumnMultiple;
      const int64_t end = units * (t + 1) / threads * kGemmColumnMultiple;   // cols is whole units (gemm.h)
      if (begin < end) k.gemm_rows(p, 0, p.rows, begin, end, thread_scratch(gemm_scratch_floats(p.rows, pass_depth, p.a_depth != 1)));
    }
  }
}

}  // namespace colossal::kernels
