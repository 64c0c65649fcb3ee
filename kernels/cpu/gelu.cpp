// GELU (tanh approximation), CPU: see gelu.h. target_clones builds AVX-512, AVX2 and baseline versions
// of the chunk loops; OpenMP splits large arrays into chunks that fit in L2.
#include "kernels/cpu/gelu.h"

#include <algorithm>

#include "kernels/cpu/vec_math.h"

namespace colossal::kernels {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;
constexpr int64_t kChunk = 1 << 14;   // elements per task: 64 KiB of x

__attribute__((target_clones("avx512f", "avx2", "default")))
void forward_chunk(const float* __restrict x, float* __restrict y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float t = tanh_bounded(kSqrt2OverPi * (v + kCubic * v * v * v));
    y[i] = 0.5f * v * (1.0f + t);
  }
}

// dx may alias dy (each element is read before it is written), so neither carries __restrict.
__attribute__((target_clones("avx512f", "avx2", "default")))
void backward_chunk(const float* __restrict x, const float* dy, float* dx, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float v2 = v * v;
    const float t = tanh_bounded(kSqrt2OverPi * (v + kCubic * v2 * v));
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kCubic * v2);
    const float grad = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du;
    dx[i] = dy[i] * grad;
  }
}

}  // namespace

void gelu_tanh_forward(const float* x, float* y, int64_t n) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t begin = c * kChunk;
    forward_chunk(x + begin, y + begin, std::min(kChunk, n - begin));
  }
}

void gelu_tanh_backward(const float* x, const float* dy, float* dx, int64_t n) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t begin = c * kChunk;
    backward_chunk(x + begin, dy + begin, dx + begin, std::min(kChunk, n - begin));
  }
}

}  // namespace colossal::kernels
