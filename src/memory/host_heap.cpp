// The host heap's policy for training: see host_heap.h.
#include "src/memory/host_heap.h"

#include <malloc.h>

namespace colossal::memory {

bool keep_freed_host_memory() {
#if defined(__GLIBC__)
  // Setting either fixes both (glibc stops moving them), so both are set.
  const bool mmap_set = mallopt(M_MMAP_THRESHOLD, static_cast<int>(kHostHeapMmapBytes)) == 1;
  const bool trim_set = mallopt(M_TRIM_THRESHOLD, static_cast<int>(kHostHeapTrimBytes)) == 1;
  return mmap_set && trim_set;
#else
  return false;
#endif
}

}  // namespace colossal::memory
