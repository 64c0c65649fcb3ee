// Quantized decoding GEMV, one instruction set's copy: see qgemv.h. The loop is gemv_isa.cpp's (one
// weight row at a time against up to four x rows, independent FMA chains, a fixed summation order),
// with the weights widened from int8 or unpacked from int4 to floats in registers: 32 inputs a step,
// summed per group and then scaled once per group into a running vector total, so a group costs one
// extra multiply-add rather than a horizontal sum. The file is compiled without contraction and spells
// its multiply-adds out, so a row sums the same bits alone, in a batch or on any thread count.
#include "kernels/cpu/isa_entry.h"
#include "kernels/cpu/simd.h"

namespace colossal::kernels::COLOSSAL_ISA {
namespace {

// 8 floats a vector at most, as in gemv_isa.cpp (Zen 4 streams 256-bit loads faster than 512-bit ones).
constexpr int kL = kLanes < 8 ? kLanes : 8;
typedef Vec<kL>::type gv;
constexpr int kStep = 32;          // inputs a step: one int4 block, 32 int8 bytes
constexpr int kV = kStep / kL;     // vectors (independent FMA chains) a step
constexpr int kRowsPerPass = (kRegs - 2 - kV) / kV >= 4 ? 4 : (kRegs - 2 - kV) / kV >= 2 ? 2 : 1;
constexpr int64_t kPrefetchBytes = 4096;   // as gemv_isa.cpp: the hardware prefetcher falls behind at 4 x rows

COLOSSAL_INLINE gv widen_int8(const int8_t* p) {
#if defined(__AVX2__)
  static_assert(kL == 8);
  return (gv)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
#else
  gv v;
  for (int k = 0; k < kL; ++k) v[k] = static_cast<float>(p[k]);
  return v;
#endif
}

// The 32 inputs of one packed int4 block (16 bytes) as kV vectors, in input order.
COLOSSAL_INLINE void unpack_int4(const uint8_t* p, gv* w) {
#if defined(__AVX2__)
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i mask = _mm_set1_epi8(0x0F), eight = _mm_set1_epi8(8);
  const __m128i lo = _mm_sub_epi8(_mm_and_si128(b, mask), eight);                        // inputs 0..15
  const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(b, 4), mask), eight);     // inputs 16..31
  w[0] = (gv)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
  w[1] = (gv)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)));
  w[2] = (gv)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
  w[3] = (gv)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)));
#else
  for (int v = 0; v < kV; ++v)
    for (int k = 0; k < kL; ++k) {
      const int e = v * kL + k;
      w[v][k] = static_cast<float>((e < 16 ? p[e] & 15 : p[e - 16] >> 4) - 8);
    }
#endif
}

// The kV chains' sum as a tree: ((a0 + a1) + (a2 + a3)) for four, the same shape for eight.
COLOSSAL_INLINE gv chains_sum(const gv* a) {
  gv s[kV];
  for (int v = 0; v < kV; ++v) s[v] = a[v];
  for (int w = kV / 2; w >= 1; w /= 2)
    for (int e = 0; e < w; ++e) s[e] = s[2 * e] + s[2 * e + 1];
  return s[0];
}

// y[r][o] for r < R of one output row: per group, the chains over whole steps, then (int8 only) whole
// vectors and single inputs past them; each group's vector sum is scaled into `total`, its scalar part
// into `tail`; y = hsum(total) + tail + bias.
template <int R, bool Int4>
COLOSSAL_INLINE void row(const float* __restrict x, int64_t in, const void* __restrict qrow, const float* __restrict scale,
                         int64_t group, float bias, float* __restrict y, int64_t ldy) {
  const int8_t* q8 = static_cast<const int8_t*>(qrow);
  const uint8_t* q4 = static_cast<const uint8_t*>(qrow);
  gv total[R] = {};
  float tail[R] = {};
  for (int64_t g0 = 0, gi = 0; g0 < in; g0 += group, ++gi) {
    const int64_t g1 = g0 + group < in ? g0 + group : in;
    gv acc[R][kV] = {};
    int64_t i = g0;
    for (; i + kStep <= g1; i += kStep) {
      gv w[kV];
      if constexpr (Int4) {
        __builtin_prefetch(q4 + i / 2 + kPrefetchBytes, 0, 3);
        unpack_int4(q4 + i / 2, w);
      } else {
        __builtin_prefetch(q8 + i + kPrefetchBytes, 0, 3);
        for (int v = 0; v < kV; ++v) w[v] = widen_int8(q8 + i + v * kL);
      }
      for (int v = 0; v < kV; ++v)
        for (int r = 0; r < R; ++r) acc[r][v] = fmadd<kL>(w[v], load_u<kL>(x + r * in + i + v * kL), acc[r][v]);
    }
    float part[R] = {};
    if constexpr (!Int4) {   // int4 groups are whole blocks
      for (; i + kL <= g1; i += kL) {
        const gv w = widen_int8(q8 + i);
        for (int r = 0; r < R; ++r) acc[r][0] = fmadd<kL>(w, load_u<kL>(x + r * in + i), acc[r][0]);
      }
      for (; i < g1; ++i)
        for (int r = 0; r < R; ++r) part[r] = fmadd(static_cast<float>(q8[i]), x[r * in + i], part[r]);
    }
    const gv s = scale[gi] - gv{};   // scale[gi] in every lane
    for (int r = 0; r < R; ++r) {
      total[r] = fmadd<kL>(s, chains_sum(acc[r]), total[r]);
      tail[r] = fmadd(scale[gi], part[r], tail[r]);
    }
  }
  for (int r = 0; r < R; ++r) y[r * ldy] = (hsum<kL>(total[r]) + tail[r]) + bias;
}

template <bool Int4>
void qgemv_rows(const float* x, int64_t rows, int64_t in, const void* q, const float* scales, int64_t group,
                const float* bias, float* y, int64_t ldy, int64_t o_begin, int64_t o_end) {
  const int64_t row_bytes = Int4 ? in / 2 : in, groups = in / group;
  for (int64_t o = o_begin; o < o_end; ++o) {
    const void* qo = static_cast<const uint8_t*>(q) + o * row_bytes;
    const float* so = scales + o * groups;
    const float b = bias ? bias[o] : 0.0f;
    for (int64_t r = 0; r < rows; r += kRowsPerPass) {
      const float* xr = x + r * in;
      float* yr = y + r * ldy + o;
      switch (rows - r < kRowsPerPass ? rows - r : kRowsPerPass) {
        case 1: row<1, Int4>(xr, in, qo, so, group, b, yr, ldy); break;
        case 2: row<2, Int4>(xr, in, qo, so, group, b, yr, ldy); break;
        case 3: row<3, Int4>(xr, in, qo, so, group, b, yr, ldy); break;
        default: row<4, Int4>(xr, in, qo, so, group, b, yr, ldy); break;
      }
    }
  }
}

}  // namespace

void qgemv_int8(const float* x, int64_t rows, int64_t in, const int8_t* q, const float* scales, int64_t group,
                const float* bias, float* y, int64_t ldy, int64_t o_begin, int64_t o_end) {
  qgemv_rows<false>(x, rows, in, q, scales, group, bias, y, ldy, o_begin, o_end);
}

void qgemv_int4(const float* x, int64_t rows, int64_t in, const uint8_t* q, const float* scales, int64_t group,
                const float* bias, float* y, int64_t ldy, int64_t o_begin, int64_t o_end) {
  qgemv_rows<true>(x, rows, in, q, scales, group, bias, y, ldy, o_begin, o_end);
}

}  // namespace colossal::kernels::COLOSSAL_ISA
