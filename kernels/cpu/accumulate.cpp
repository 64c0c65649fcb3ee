// See accumulate.h. Threads split the buffers into fixed blocks; each block runs the active
// instruction set's loop (accumulate_isa.cpp).
#include "kernels/cpu/accumulate.h"

#include <algorithm>

#include "kernels/cpu/isa_kernels.h"

namespace colossal::kernels {

void accumulate_half(float* dst, const uint16_t* src, int64_t n, Half16 kind) {
  const auto block = kind == Half16::bf16 ? active_kernels().accumulate_bf16 : active_kernels().accumulate_fp16;
  constexpr int64_t kGrain = 1 << 16;   // memory-bound: small buffers are not worth waking the team
#pragma omp parallel for schedule(static) if (n > 4 * kGrain)
  for (int64_t start = 0; start < n; start += kGrain) block(dst + start, src + start, std::min(kGrain, n - start));
}

}  // namespace colossal::kernels
