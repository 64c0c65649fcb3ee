// Per-thread scratch for the dispatching files (attention.cpp, decode_attention.cpp): each OpenMP
// thread keeps one buffer across calls (the pool's threads persist), grown when a call needs more, so
// a kernel called once per layer per step neither allocates nor zero-fills its scratch each time.
// The contents are whatever the thread's last call left: kernels write before they read.
#pragma once
#include <cstddef>
#include <vector>

namespace colossal::kernels {

inline float* thread_scratch(size_t floats) {
  thread_local std::vector<float> buffer;
  if (buffer.size() < floats) buffer.resize(floats);
  return buffer.data();
}

}  // namespace colossal::kernels
