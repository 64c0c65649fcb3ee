// What one instruction set offers the *_isa.cpp kernels: the float vector of its width (GCC vector
// extensions, so one source serves every set), how many of them fit in registers, and the namespace
// this copy's functions go in. CMake compiles each *_isa.cpp once per set with COLOSSAL_ISA naming it
// and the matching -m flags; everything here is internal to that copy (no symbol two copies share,
// so the linker can never hand AVX-512 code to a caller on an AVX2 machine).
#pragma once
#include <cstdint>
#if defined(__FMA__)
#include <immintrin.h>
#endif

#ifndef COLOSSAL_ISA
#error "COLOSSAL_ISA must name the instruction set this copy is compiled for (see kernels/CMakeLists.txt)"
#endif

namespace colossal::kernels::COLOSSAL_ISA {
namespace {

#if defined(__AVX512F__)
constexpr int kLanes = 16;   // floats in one zmm register
constexpr int kRegs = 32;
#elif defined(__AVX2__)
constexpr int kLanes = 8;    // ymm
constexpr int kRegs = 16;
#else
constexpr int kLanes = 4;    // xmm (SSE2, every x86-64; other targets' 128-bit units alike)
constexpr int kRegs = 16;
#endif

// A vector of N floats, and its unaligned twin for loads and stores from rows of any offset. Kernels
// use vf (this set's full width); one may use a narrower Vec<N> where that measured faster.
template <int N>
struct Vec {
  typedef float type __attribute__((vector_size(N * 4)));
  typedef float unaligned __attribute__((vector_size(N * 4), aligned(4)));
};
typedef Vec<kLanes>::type vf;

#define COLOSSAL_INLINE __attribute__((always_inline)) inline

template <int N = kLanes>
COLOSSAL_INLINE typename Vec<N>::type load_u(const float* p) { return *reinterpret_cast<const typename Vec<N>::unaligned*>(p); }
template <int N = kLanes>
COLOSSAL_INLINE void store_u(float* p, typename Vec<N>::type v) { *reinterpret_cast<typename Vec<N>::unaligned*>(p) = v; }
// a * b + c rounded once where the set has FMA, else rounded twice: spelled out, not left to the
// compiler's contraction, so code that promises the same bits along two paths (the decoding GEMV's
// batch and single row) keeps them whatever the compiler or its instrumentation decide to fuse.
template <int N>
COLOSSAL_INLINE typename Vec<N>::type fmadd(typename Vec<N>::type a, typename Vec<N>::type b, typename Vec<N>::type c) {
#if defined(__FMA__)
  typedef typename Vec<N>::type v;
#if defined(__AVX512F__)
  if constexpr (N == 16) return (v)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#endif
  if constexpr (N == 8) return (v)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
  else if constexpr (N == 4) return (v)_mm_fmadd_ps((__m128)a, (__m128)b, (__m128)c);
  else return a * b + c;
#else
  return a * b + c;
#endif
}
COLOSSAL_INLINE float fmadd(float a, float b, float c) {
#if defined(__FMA__)
  return __builtin_fmaf(a, b, c);
#else
  return a * b + c;
#endif
}

// x - 0 is x for every x (x + 0 is not, for -0), so this compiles to a lone broadcast.
COLOSSAL_INLINE vf splat(float x) { return x - vf{}; }
// Sum of the lanes as a tree (halves added, then their halves...): log2(N) vector adds instead of N
// scalar ones, and one fixed order on every call.
template <int N = kLanes>
COLOSSAL_INLINE float hsum(typename Vec<N>::type v) {
  float t[N];
  store_u<N>(t, v);
  for (int w = N / 2; w >= 1; w /= 2)
    for (int e = 0; e < w; ++e) t[e] += t[e + w];
  return t[0];
}

}  // namespace
}  // namespace colossal::kernels::COLOSSAL_ISA
