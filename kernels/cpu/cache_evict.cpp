// Cache eviction: see cache_evict.h.
#include "kernels/cpu/cache_evict.h"

#if defined(COLOSSAL_KERNELS_X86)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace colossal::kernels {
namespace {

#if defined(COLOSSAL_KERNELS_X86)
bool has_clflushopt() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & (1u << 23)) != 0;
}

template <class Flush>
void each_line(const char* p, size_t bytes, Flush flush) {
  for (size_t at = 0; at < bytes; at += 64) flush(p + at);
  flush(p + bytes - 1);   // the last line, where the buffer does not start on one
}

__attribute__((target("clflushopt"))) void flush_opt(const char* p, size_t bytes) {
  each_line(p, bytes, [](const char* q) __attribute__((target("clflushopt"))) { _mm_clflushopt(const_cast<char*>(q)); });
}
#endif

}  // namespace

void evict_from_caches(const void* data, size_t bytes) {
#if defined(COLOSSAL_KERNELS_X86)
  if (bytes == 0) return;
  static const bool opt = has_clflushopt();
  const auto* p = static_cast<const char*>(data);
  if (opt) flush_opt(p, bytes);
  else each_line(p, bytes, [](const char* q) { _mm_clflush(q); });
  _mm_mfence();   // the flushes done before the timed call starts
#else
  (void)data, (void)bytes;
#endif
}

}  // namespace colossal::kernels
