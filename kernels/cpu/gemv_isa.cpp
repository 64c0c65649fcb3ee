// Decoding GEMV, one instruction set's copy: see gemv.h. One weight row at a time against up to four
// x rows (eight with AVX-512's 32 registers, and then two weight rows a pass): each weight vector is
// loaded once and used for every x row of the pass, with the accumulators in registers. Every output
// sums its vector lanes, then the tail past the last whole vector, in one fixed order, so neither the
// row count nor the thread split changes a result. The multiply-adds are explicit (simd.h's fmadd)
// and the file is compiled without contraction, so that order does not rest on the compiler fusing
// alike in every instantiation (clang with UBSan did not).
#include "kernels/cpu/isa_entry.h"
#include "kernels/cpu/simd.h"

// GCC 12's 512-bit extract starts from _mm512_undefined_*, which -O3 reports as maybe uninitialized
// wherever it inlines (as in qgemm_isa.cpp).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace colossal::kernels::COLOSSAL_ISA {
namespace {

// At most 8 floats a vector, also in the AVX-512 copy (which keeps its 32 registers): on an AMD EPYC
// (Zen 4 splits 512-bit loads in two) the weight stream ran 6% slower with 512-bit loads than with the
// AVX2 copy's 256-bit ones (whole-process A/B, 10 pairs), and a GEMV is nothing but that stream.
constexpr int kGemvLanes = kLanes < 8 ? kLanes : 8;
typedef Vec<kGemvLanes>::type gv;

// Accumulators per (weight row, x row): a dot product of one weight row runs kChains independent FMA
// chains over alternating vectors, so one weight row streams at a time (a single sequential stream per
// core: 34 GB/s on an AMD EPYC Zen 4, against 25-29 GB/s with four rows interleaved) while two FMAs are
// in flight per x row. Two chains, not four: four x rows a pass then fit AVX2's 16 registers (8
// accumulators, a weight and an x vector), where four chains held two rows a pass and a 4-sequence step
// read every weight vector twice. On an AMD EPYC Zen 3 (AVX2, the 124M shape's layers) 4 rows then
// moved 1.4x the weights a second and 8 rows 1.37x where the weights sat in L1, and 1.03-1.07x and
// 1.14-1.23x streamed from memory (2 threads); a lone row lost 20% in L1 (two chains of FMA latency)
// and nothing from memory, which is where decoding reads it. The same for every row count, so a batch
// sums exactly as each sequence alone.
constexpr int kChains = 2;
static_assert(kChains == 2, "row() sums the chains as a0 + a1");
// x rows per pass over a weight row: their kChains accumulators each, one weight and one x vector in
// registers. Further x rows take another pass over the same weight row, which is then in L1.
constexpr int kRowsPerPass = kRegs >= 32 ? 8 : 4;
static_assert(kRowsPerPass * kChains + 2 <= kRegs, "a pass's accumulators, a weight and an x vector fit the registers");

// Weights are prefetched this many floats (4 KiB) ahead of the loads, from three x rows a pass: with
// four x rows a weight line takes four times the multiply-adds, the hardware prefetcher fell behind,
// and the stream ran at 0.61 of the machine's read bandwidth. On a Zen 4 (69 GB/s) whole 4-sequence
// decodes took 0.83 of the time with it (1 KiB ahead: 0.90; 8 KiB: no better than 4). Not for one or
// two rows, whose stream the hardware keeps up with: on a Zen 3 a prefetch there made the
// single-sequence stream 13% slower (and two rows 7%), as it did a plain sum over the same memory.
constexpr int64_t kPrefetchFloats = 1024;
constexpr int kPrefetchFromRows = 3;

// y[r][o] for r < R: lanes summed as the chains' sum a0 + a1, tree-wise, then the tail past the last
// whole vector in order.
template <int R>
COLOSSAL_INLINE void row(const float* __restrict x, int64_t in, const float* __restrict w, float bias,
                         float* __restrict y, int64_t ldy) {
  gv acc[R][kChains] = {};
  int64_t i = 0;
  for (; i + kChains * kGemvLanes <= in; i += kChains * kGemvLanes) {
    // One cache line a step (two chains of eight floats); past the row it is the next row's, or past
    // the matrix a prefetch that loads nothing and never faults.
    static_assert(kChains * kGemvLanes <= 16, "one 64-byte line covers a step");
    if constexpr (R >= kPrefetchFromRows) __builtin_prefetch(w + i + kPrefetchFloats, 0, 3);
    for (int c = 0; c < kChains; ++c) {
      const gv wv = load_u<kGemvLanes>(w + i + c * kGemvLanes);
      for (int r = 0; r < R; ++r) acc[r][c] = fmadd<kGemvLanes>(wv, load_u<kGemvLanes>(x + r * in + i + c * kGemvLanes), acc[r][c]);
    }
  }
  for (; i + kGemvLanes <= in; i += kGemvLanes) {
    const gv wv = load_u<kGemvLanes>(w + i);
    for (int r = 0; r < R; ++r) acc[r][0] = fmadd<kGemvLanes>(wv, load_u<kGemvLanes>(x + r * in + i), acc[r][0]);
  }
  for (int r = 0; r < R; ++r) {
    float s = hsum<kGemvLanes>(acc[r][0] + acc[r][1]);
    for (int64_t t = i; t < in; ++t) s = fmadd(w[t], x[r * in + t], s);
    y[r * ldy] = s + bias;
  }
}

#if defined(__AVX512F__)
// Eight x rows on AVX-512: one 16-lane chain per row, whose lanes are row()'s two 8-lane chains side by
// side (lane j: chain 0's lane j, lane 8 + j: chain 1's), so each lane sums the same products in the
// same order and a row's bits are row()'s. Eight rows are eight chains, enough to keep both multiply-add
// units busy, each instruction twice as wide: at eight sequences the 8-lane passes were bound by their
// multiply-adds (in L2 MKL's sgemm ran the 768 x 768 layer 1.6x faster and the first-use timing took
// it), and time spent on them is time the weight stream waits. Decoding eight sequences of the 124M
// shape (fp32, 2 threads, an Intel Xeon with AVX-512) went from 0.64 to 0.68 of the bandwidth bound.
// On a Zen 4, which runs a 512-bit multiply-add as two 256-bit halves, the pass issues the same work as
// the 8-lane one (not measured there).
constexpr int kWideRows = 8;
typedef Vec<16>::type wide;

// O weight rows (ldw apart) against the same eight x rows: each x vector is loaded once for the O rows.
// With eight x rows the pass loads eight x vectors for every weight vector, and the MLP's second layer
// (3072 inputs: 96 KB of x) does not fit a 48 KB L1, so x came from L2 for every output; two outputs a
// pass halve that. Each output's operations are row_wide's alone, in the same order.
template <int O>
COLOSSAL_INLINE void row_wide(const float* __restrict x, int64_t in, const float* __restrict w, int64_t ldw, const float* bias,
                              float* __restrict y, int64_t ldy) {
  constexpr int R = kWideRows;
  wide acc[O][R] = {};
  int64_t i = 0;
  for (; i + 16 <= in; i += 16) {
    wide wv[O];
    for (int o = 0; o < O; ++o) {
      __builtin_prefetch(w + o * ldw + i + kPrefetchFloats, 0, 3);
      wv[o] = load_u<16>(w + o * ldw + i);
    }
    for (int r = 0; r < R; ++r) {
      const wide xv = load_u<16>(x + r * in + i);
      for (int o = 0; o < O; ++o) acc[o][r] = fmadd<16>(wv[o], xv, acc[o][r]);
    }
  }
  for (int o = 0; o < O; ++o) {
    const float* wo = w + o * ldw;
    gv lo[R], hi[R];
    for (int r = 0; r < R; ++r) {
      lo[r] = (gv)_mm512_castps512_ps256((__m512)acc[o][r]);
      hi[r] = (gv)_mm512_extractf32x8_ps((__m512)acc[o][r], 1);
    }
    int64_t t0 = i;
    for (; t0 + kGemvLanes <= in; t0 += kGemvLanes) {   // row()'s tail vectors, into chain 0
      const gv wv = load_u<kGemvLanes>(wo + t0);
      for (int r = 0; r < R; ++r) lo[r] = fmadd<kGemvLanes>(wv, load_u<kGemvLanes>(x + r * in + t0), lo[r]);
    }
    for (int r = 0; r < R; ++r) {
      float s = hsum<kGemvLanes>(lo[r] + hi[r]);
      for (int64_t t = t0; t < in; ++t) s = fmadd(wo[t], x[r * in + t], s);
      y[r * ldy + o] = s + bias[o];
    }
  }
}
#endif

}  // namespace

void gemv(const float* x, int64_t rows, int64_t in, const float* w, const float* bias, float* y, int64_t ldy,
          int64_t o_begin, int64_t o_end) {
  int64_t o = o_begin;
#if defined(__AVX512F__)
  if (kRowsPerPass == kWideRows && rows % kWideRows == 0) {   // whole passes of eight x rows: two outputs at a time
    for (; o + 2 <= o_end; o += 2) {
      const float b[2] = {bias ? bias[o] : 0.0f, bias ? bias[o + 1] : 0.0f};
      for (int64_t r = 0; r < rows; r += kWideRows) row_wide<2>(x + r * in, in, w + o * in, in, b, y + r * ldy + o, ldy);
    }
  }
#endif
  for (; o < o_end; ++o) {
    const float* wo = w + o * in;
    const float b = bias ? bias[o] : 0.0f;
    for (int64_t r = 0; r < rows; r += kRowsPerPass) {
      const float* xr = x + r * in;
      float* yr = y + r * ldy + o;
      switch (rows - r < kRowsPerPass ? rows - r : kRowsPerPass) {
        case 1: row<1>(xr, in, wo, b, yr, ldy); break;
        case 2: row<2>(xr, in, wo, b, yr, ldy); break;
        case 3: row<3>(xr, in, wo, b, yr, ldy); break;
        case 4: row<4>(xr, in, wo, b, yr, ldy); break;
        case 5: if constexpr (kRowsPerPass > 4) row<5>(xr, in, wo, b, yr, ldy); break;
        case 6: if constexpr (kRowsPerPass > 4) row<6>(xr, in, wo, b, yr, ldy); break;
        case 7: if constexpr (kRowsPerPass > 4) row<7>(xr, in, wo, b, yr, ldy); break;
        default:
#if defined(__AVX512F__)
          if constexpr (kRowsPerPass == kWideRows) {
            row_wide<1>(xr, in, wo, in, &b, yr, ldy);
            break;
          }
#endif
          row<kRowsPerPass>(xr, in, wo, b, yr, ldy);
          break;
      }
    }
  }
}

namespace {

// W stored transposed (wt [in][out], as GPT-2's Conv1D weights lie in a checkpoint read in place): each
// output is one multiply-add chain over i in order, y = ((0 + w0 x0) + w1 x1 ...) + bias, the same in
// the vector lanes and the scalar tail, so neither the row count nor the thread split changes a result.
// A pass walks kTChunk rows of wt at once across this thread's columns (a sequential stream per row),
// each output's partial sum passing through a register for the chunk's multiply-adds; x is broadcast
// from memory in the multiply-add itself. Over the 124M shape's 48 block layers (2 threads, an AMD
// EPYC) the weights stream at 0.8 of gemv's rate at 1 row and 0.85 at 8 rows; 4 rows a chunk with x in
// registers gave 0.8 and 0.65, and a software prefetch 1 KiB ahead in each row nothing.
constexpr int kTChunk = 8;
constexpr int kTRows = 4;   // x rows a pass; more take another pass over the chunk's rows, then in L1

COLOSSAL_INLINE gv broadcast(float v) { return v - gv{}; }   // x - 0 is x, also for -0

template <int R, int C>
COLOSSAL_INLINE void t_chunk(const float* __restrict x, int64_t in, const float* __restrict wt, int64_t ldw, float* __restrict y,
                             int64_t ldy, int64_t o_begin, int64_t o_vec_end, bool first) {
  for (int64_t o = o_begin; o < o_vec_end; o += kGemvLanes) {
    gv w[C];
    for (int c = 0; c < C; ++c) w[c] = load_u<kGemvLanes>(wt + c * ldw + o);
    for (int r = 0; r < R; ++r) {
      gv acc = first ? gv{} : load_u<kGemvLanes>(y + r * ldy + o);
      for (int c = 0; c < C; ++c) acc = fmadd<kGemvLanes>(w[c], broadcast(x[r * in + c]), acc);
      store_u<kGemvLanes>(y + r * ldy + o, acc);
    }
  }
}

template <int C>
void t_rows(const float* x, int64_t rows, int64_t in, const float* wt, int64_t ldw, float* y, int64_t ldy, int64_t o_begin,
            int64_t o_vec_end, bool first) {
  for (int64_t r = 0; r < rows; r += kTRows) {
    const float* xr = x + r * in;
    float* yr = y + r * ldy;
    switch (rows - r < kTRows ? rows - r : kTRows) {
      case 1: t_chunk<1, C>(xr, in, wt, ldw, yr, ldy, o_begin, o_vec_end, first); break;
      case 2: t_chunk<2, C>(xr, in, wt, ldw, yr, ldy, o_begin, o_vec_end, first); break;
      case 3: if constexpr (kTRows > 3) t_chunk<3, C>(xr, in, wt, ldw, yr, ldy, o_begin, o_vec_end, first); break;
      default: t_chunk<kTRows, C>(xr, in, wt, ldw, yr, ldy, o_begin, o_vec_end, first); break;
    }
  }
}

}  // namespace

void gemv_t(const float* x, int64_t rows, int64_t in, const float* wt, int64_t ldw, const float* bias, float* y, int64_t ldy,
            int64_t o_begin, int64_t o_end) {
  const int64_t o_vec_end = o_begin + (o_end - o_begin) / kGemvLanes * kGemvLanes;
  int64_t i = 0;
  for (; i + kTChunk <= in; i += kTChunk) t_rows<kTChunk>(x + i, rows, in, wt + i * ldw, ldw, y, ldy, o_begin, o_vec_end, i == 0);
  for (; i < in; ++i) t_rows<1>(x + i, rows, in, wt + i * ldw, ldw, y, ldy, o_begin, o_vec_end, i == 0);
  for (int64_t r = 0; r < rows; ++r) {
    float* yr = y + r * ldy;
    for (int64_t o = o_vec_end; o < o_end; ++o) {   // the tail: the lanes' operations one at a time
      float s = 0.0f;
      for (int64_t k = 0; k < in; ++k) s = fmadd(wt[k * ldw + o], x[r * in + k], s);
      yr[o] = s;
    }
    if (in == 0)
      for (int64_t o = o_begin; o < o_vec_end; ++o) yr[o] = 0.0f;
    if (bias)
      for (int64_t o = o_begin; o < o_end; ++o) yr[o] = yr[o] + bias[o];
  }
}

}  // namespace colossal::kernels::COLOSSAL_ISA
