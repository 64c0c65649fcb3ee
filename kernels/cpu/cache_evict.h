// Puts a buffer out of every cache level, so the next read comes from memory: a first-use timing
// (src/nn/kernel_choice.h) of a decoding GEMV measures its weight as decoding reads it, once a step after
// the other layers' weights have gone through the caches, rather than hot in L2 after the warm-ups.
#pragma once
#include <cstddef>

namespace colossal::kernels {

// x86: CLFLUSHOPT over every line where the CPU has it (25 MB in 0.9 ms on an Intel Xeon), else CLFLUSH
// (14 ms: each flush waits for the one before). Elsewhere nothing: the timing then sees the data warm.
void evict_from_caches(const void* data, size_t bytes);

}  // namespace colossal::kernels
