// Per-thread scratch for the dispatching files (attention.cpp, decode_attention.cpp): each OpenMP
// thread keeps one buffer across calls (the pool's threads persist), grown when a call needs more, so
// a kernel called once per layer per step neither allocates nor zero-fills its scratch each time.
// The contents are whatever the thread's last call left: kernels write before they read.
//
// The buffer starts on a cache line. The kernels pack operands here and read them back in whole
// vectors; std::vector's storage starts 16 bytes past a line (glibc's chunk header), so every 512-bit
// load of a packed GEMM operand straddled two lines, and on an Intel Xeon (AVX-512, two loads a cycle,
// a split load costing both) the GEMM's register tile ran at 0.55 of the machine's multiply-add peak
// where an aligned buffer gave 0.63-0.76 (one thread, operands in cache).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace colossal::kernels {

inline constexpr size_t kScratchAlignBytes = 64;

// `floats` floats of `buffer`, grown as needed, starting on a cache line.
inline float* aligned_floats(std::vector<float>& buffer, size_t floats) {
  constexpr size_t pad = kScratchAlignBytes / sizeof(float);
  if (buffer.size() < floats + pad) buffer.resize(floats + pad);
  const auto address = reinterpret_cast<uintptr_t>(buffer.data());
  return reinterpret_cast<float*>((address + kScratchAlignBytes - 1) & ~uintptr_t{kScratchAlignBytes - 1});
}

inline float* thread_scratch(size_t floats) {
  thread_local std::vector<float> buffer;
  return aligned_floats(buffer, floats);
}

}  // namespace colossal::kernels
