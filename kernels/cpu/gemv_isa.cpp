// Decoding GEMV, one instruction set's copy: see gemv.h. Up to four x rows at a time against a block
// of weight rows: the x vectors and one accumulator per (weight row, x row) stay in registers, each
// weight vector is loaded once and used for every x row. Every output sums its vector lanes, then the
// tail past the last whole vector, in one fixed order, so blocking never changes a result.
#include "kernels/cpu/isa_entry.h"
#include "kernels/cpu/simd.h"

namespace colossal::kernels::COLOSSAL_ISA {
namespace {

// At most 8 floats a vector, also in the AVX-512 copy (which keeps its 32 registers): on an AMD EPYC
// (Zen 4 splits 512-bit loads in two) the weight stream ran 6% slower with 512-bit loads than with the
// AVX2 copy's 256-bit ones (whole-process A/B, 10 pairs), and a GEMV is nothing but that stream.
constexpr int kGemvLanes = kLanes < 8 ? kLanes : 8;
typedef Vec<kGemvLanes>::type gv;

// Weight rows per block for R x rows: R x vectors, OB * R accumulators and one weight vector live.
template <int R>
constexpr int weight_rows() {
  constexpr int fit = (kRegs / 2) / R;
  return fit < 1 ? 1 : (fit > 4 ? 4 : fit);
}

template <int R, int OB>
COLOSSAL_INLINE void block(const float* __restrict x, int64_t in, const float* __restrict w, const float* bias,
                           float* __restrict y, int64_t ldy, int64_t o) {
  gv acc[OB][R] = {};
  int64_t i = 0;
  for (; i + kGemvLanes <= in; i += kGemvLanes) {
    gv xv[R];
    for (int r = 0; r < R; ++r) xv[r] = load_u<kGemvLanes>(x + r * in + i);
    for (int b = 0; b < OB; ++b) {
      const gv wv = load_u<kGemvLanes>(w + (o + b) * in + i);
      for (int r = 0; r < R; ++r) acc[b][r] += wv * xv[r];
    }
  }
  for (int b = 0; b < OB; ++b)
    for (int r = 0; r < R; ++r) {
      float s = hsum<kGemvLanes>(acc[b][r]);
      for (int64_t t = i; t < in; ++t) s += w[(o + b) * in + t] * x[r * in + t];
      y[r * ldy + o + b] = bias ? s + bias[o + b] : s;
    }
}

template <int R>
void rows_of(const float* x, int64_t in, const float* w, const float* bias, float* y, int64_t ldy, int64_t o_begin,
             int64_t o_end) {
  constexpr int ob = weight_rows<R>();
  int64_t o = o_begin;
  for (; o + ob <= o_end; o += ob) block<R, ob>(x, in, w, bias, y, ldy, o);
  for (; o < o_end; ++o) block<R, 1>(x, in, w, bias, y, ldy, o);
}

}  // namespace

void gemv(const float* x, int64_t rows, int64_t in, const float* w, const float* bias, float* y, int64_t ldy,
          int64_t o_begin, int64_t o_end) {
  for (int64_t r = 0; r < rows; r += 4) {
    const float* xr = x + r * in;
    float* yr = y + r * ldy;
    switch (rows - r < 4 ? rows - r : 4) {
      case 1: rows_of<1>(xr, in, w, bias, yr, ldy, o_begin, o_end); break;
      case 2: rows_of<2>(xr, in, w, bias, yr, ldy, o_begin, o_end); break;
      case 3: rows_of<3>(xr, in, w, bias, yr, ldy, o_begin, o_end); break;
      default: rows_of<4>(xr, in, w, bias, yr, ldy, o_begin, o_end); break;
    }
  }
}

}  // namespace colossal::kernels::COLOSSAL_ISA
