// The decoding GEMVs' weight streams a core: see weight_streams.h.
#include "kernels/cpu/weight_streams.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include <atomic>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace colossal::kernels {
namespace {

constexpr int kNoOverride = 0;
std::atomic<int> g_override{kNoOverride};

int vendor_default() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_is("intel")) return 4;
#endif
  return 1;
}

// The CPU's family as AMD and Intel number it: the base family, plus the extended one where the base is 15.
int cpu_family() {
#if defined(__x86_64__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
  const int base = static_cast<int>((a >> 8) & 0xF);
  return base == 0xF ? base + static_cast<int>((a >> 20) & 0xFF) : base;
#else
  return 0;
#endif
}

}  // namespace

bool prefetch_one_row() {
  static const bool yes = [] {
#if defined(__x86_64__)
    __builtin_cpu_init();
    return __builtin_cpu_is("amd") && cpu_family() >= 26;
#else
    return false;
#endif
  }();
  return yes;
}

int weight_streams_from(const char* value) {
  if (!value || !*value) return vendor_default();
  const std::string v(value);
  if (v == "1" || v == "2" || v == "3" || v == "4") return v[0] - '0';
  throw std::invalid_argument("COLOSSAL_WEIGHT_STREAMS=\"" + v + "\" is not a count of weight streams a core (valid: 1, 2, 3, 4)");
}

int weight_streams() {
  if (const int o = g_override.load(std::memory_order_relaxed); o != kNoOverride) return o;
  static const int streams = weight_streams_from(std::getenv("COLOSSAL_WEIGHT_STREAMS"));
  return streams;
}

ScopedWeightStreams::ScopedWeightStreams(int streams) : previous_(g_override.load()) {
  if (streams < 1 || streams > 4) throw std::invalid_argument("ScopedWeightStreams: " + std::to_string(streams) + " is not 1 to 4");
  g_override.store(streams);
}

ScopedWeightStreams::~ScopedWeightStreams() { g_override.store(previous_); }

}  // namespace colossal::kernels
