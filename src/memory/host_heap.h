// The host heap's policy for a training process: freed memory stays mapped for the next step.
//
// A training step allocates and frees the same tensors every step. glibc returns the free top of its
// heap to the kernel once it exceeds the trim threshold, which by default follows the largest mapping
// freed so far (twice it). At GPT-2 124M (1024 tokens a step) the MLP's 12.6 MB activations set it
// to 25 MB, each backward freed more than that at the heap's top, and the next step faulted the pages
// back in: 37K page faults a step, inside the GELU's and the GEMMs' parallel loops, where one faulting
// thread holds the other at the loop's end. Kept mapped, the steady steps fault none.
#pragma once
#include <cstdint>

namespace colossal::memory {

// Allocations from kHostHeapMmapBytes up get their own mapping (and give it back when freed); below,
// the heap, whose free top is returned to the kernel only past kHostHeapTrimBytes. Process-wide;
// training calls it once before it builds the model. Returns false where the C library refuses either
// setting.
constexpr int64_t kHostHeapMmapBytes = int64_t{32} << 20;    // glibc's own ceiling for its moving threshold
constexpr int64_t kHostHeapTrimBytes = int64_t{256} << 20;   // 124M's steps needed more than 32 MB, less than 64
bool keep_freed_host_memory();

}  // namespace colossal::memory
