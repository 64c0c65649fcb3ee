// Decoding GEMV, one instruction set's copy: see gemv.h. Weight rows against up to four x rows a pass
// (eight with AVX-512's 32 registers): each weight vector is loaded once and used for every x row of the
// pass, with the accumulators in registers. Where the machine wants several streams a core
// (weight_streams.h), a pass takes two to four weight rows from as many stretches of the thread's
// outputs, else one row at a time (neighbouring pairs at eight x rows). Every output sums its vector
// lanes, then the tail past the last whole vector, in one fixed order, so neither the row count, the
// streams nor the thread split changes a result. The multiply-adds are explicit (simd.h's fmadd) and the
// file is compiled without contraction, so that order does not rest on the compiler fusing alike in
// every instantiation (clang with UBSan did not).
#include "kernels/cpu/isa_entry.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/weight_streams.h"

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
// chains over alternating vectors, so a weight row streams on its own (on an AMD EPYC Zen 4 one
// sequential stream a core read 34 GB/s, against 25-29 GB/s with four rows interleaved; Intel's cores
// want several, weight_streams.h) while two FMAs are in flight per x row. Two chains, not four: four x
// rows a pass then fit AVX2's 16 registers (8 accumulators, a weight and an x vector), where four
// chains held two rows a pass and a 4-sequence step read every weight vector twice. On an AMD EPYC
// Zen 3 (AVX2, the 124M shape's layers) 4 rows then moved 1.4x the weights a second and 8 rows 1.37x
// where the weights sat in L1, and 1.03-1.07x and 1.14-1.23x streamed from memory (2 threads); a lone
// row lost 20% in L1 (two chains of FMA latency) and nothing from memory, which is where decoding reads
// it. The same for every row count, so a batch sums exactly as each sequence alone.
constexpr int kChains = 2;
static_assert(kChains == 2, "row() sums the chains as a0 + a1");
// x rows per pass over a weight row: their kChains accumulators each, one weight and one x vector in
// registers. Further x rows take another pass over the same weight row, which is then in L1.
constexpr int kRowsPerPass = kRegs >= 32 ? 8 : 4;
static_assert(kRowsPerPass * kChains + 2 <= kRegs, "a pass's accumulators, a weight and an x vector fit the registers");

// Weights are prefetched this many floats (4 KiB) ahead of the loads, from three x rows a pass: with
// four x rows a weight line takes four times the multiply-adds, the hardware prefetcher fell behind,
// and the stream ran at 0.61 of the machine's read bandwidth. On a Zen 4 (69 GB/s) whole 4-sequence
// decodes took 0.83 of the time with it (1 KiB ahead: 0.90; 8 KiB: no better than 4). For one or two
// rows only where weight_streams.h's prefetch_one_row says so: on a Zen 3 a prefetch there made the
// single-sequence stream 13% slower (and two rows 7%), as it did a plain sum over the same memory,
// while on a Zen 5 it made the one-row GEMV over the 124M shape's layers 1.03-1.13x faster (9 of 9
// harness runs, 2 to 8 KiB ahead) and whole single-sequence decodes 1.02-1.04x (medians of two sets of
// alternating pairs, faster in 8 of 11).
constexpr int64_t kPrefetchFloats = 1024;
constexpr int kPrefetchFromRows = 3;

// Weight rows read at once on machines that want several streams a core (weight_streams.h), and how far
// ahead each is prefetched: 2 KiB, the best of 1, 2 and 4 KiB with one to four x rows on an Intel Xeon.
constexpr int kMaxStreams = 4;
constexpr int64_t kStreamPrefetchFloats = 512;

// The most weight rows a pass over R x rows can stream at once: their kChains accumulators for every x
// row, a weight vector each and an x vector in registers.
constexpr int fit_streams(int R) {
  for (int s = kMaxStreams; s > 1; --s)
    if (s * R * kChains + s + 1 <= kRegs) return s;
  return 1;
}

// y[s * y_step + r * ldy] for the S weight rows w + s * w_step and the x rows r < R: lanes summed as the
// chains' sum a0 + a1, tree-wise, then the tail past the last whole vector in order. Each output's
// operations are the same whatever S and whatever rows share its pass.
// `from_rows`: the fewest x rows a pass from one stream prefetches with (kPrefetchFromRows, or 1 where
// prefetch_one_row), a machine's constant; a pass with at least kPrefetchFromRows always does.
template <int R, int S>
COLOSSAL_INLINE void row(const float* __restrict x, int64_t in, const float* __restrict w, int64_t w_step, const float* bias,
                         float* __restrict y, int64_t y_step, int64_t ldy, int from_rows) {
  gv acc[S][R][kChains] = {};
  int64_t i = 0;
  for (; i + kChains * kGemvLanes <= in; i += kChains * kGemvLanes) {
    // One cache line a step (two chains of eight floats); past the row it is the next row's, or past
    // the matrix a prefetch that loads nothing and never faults.
    static_assert(kChains * kGemvLanes <= 16, "one 64-byte line covers a step");
    if constexpr (S > 1) {
      for (int s = 0; s < S; ++s) __builtin_prefetch(w + s * w_step + i + kStreamPrefetchFloats, 0, 3);
    } else if (R >= kPrefetchFromRows || R >= from_rows) {
      __builtin_prefetch(w + i + kPrefetchFloats, 0, 3);
    }
    for (int c = 0; c < kChains; ++c) {
      gv wv[S];
      for (int s = 0; s < S; ++s) wv[s] = load_u<kGemvLanes>(w + s * w_step + i + c * kGemvLanes);
      for (int r = 0; r < R; ++r) {
        const gv xv = load_u<kGemvLanes>(x + r * in + i + c * kGemvLanes);
        for (int s = 0; s < S; ++s) acc[s][r][c] = fmadd<kGemvLanes>(wv[s], xv, acc[s][r][c]);
      }
    }
  }
  for (; i + kGemvLanes <= in; i += kGemvLanes) {
    for (int r = 0; r < R; ++r) {
      const gv xv = load_u<kGemvLanes>(x + r * in + i);
      for (int s = 0; s < S; ++s) acc[s][r][0] = fmadd<kGemvLanes>(load_u<kGemvLanes>(w + s * w_step + i), xv, acc[s][r][0]);
    }
  }
  for (int s = 0; s < S; ++s) {
    const float* ws = w + s * w_step;
    for (int r = 0; r < R; ++r) {
      float sum = hsum<kGemvLanes>(acc[s][r][0] + acc[s][r][1]);
      for (int64_t t = i; t < in; ++t) sum = fmadd(ws[t], x[r * in + t], sum);
      y[s * y_step + r * ldy] = sum + bias[s];
    }
  }
}

// The most x rows a pass can take with two weight streams.
constexpr int stream_pass_rows() {
  int r = 1;
  while (fit_streams(r + 1) >= 2) ++r;
  return r;
}
constexpr int kStreamPassRows = stream_pass_rows();

// The biases of the N outputs o, o + step, ... (zeros without a bias).
template <int N>
COLOSSAL_INLINE void stream_biases(const float* bias, int64_t o, int64_t step, float (&b)[N]) {
  for (int s = 0; s < N; ++s) b[s] = bias ? bias[o + s * step] : 0.0f;
}

// f.template operator()<S>(o, step) for [o_begin, o_end) in S streams: stream s walks its own stretch
// of n / S outputs (`step` apart from the next stream's), all S advancing together; the n % S outputs
// left at the end go one at a time (S = 1).
template <int S, class F>
COLOSSAL_INLINE void in_streams(int64_t o_begin, int64_t o_end, const F& f) {
  int64_t o = o_begin;
  if constexpr (S > 1) {
    const int64_t step = (o_end - o_begin) / S;
    for (int64_t k = 0; k < step; ++k) f.template operator()<S>(o_begin + k, step);
    o += S * step;
  }
  for (; o < o_end; ++o) f.template operator()<1>(o, 0);
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
// Weight rows a pass of eight x rows streams where the machine wants several streams: 3 x 8 accumulators,
// three weight vectors and an x vector. Eight sequences on an Intel Xeon (124M, 2 threads) decoded at
// 1.05x with two and 1.10x with three, against neighbouring pairs from one stream.
constexpr int kWideStreams = 3;

// O weight rows (w_step apart, their outputs y_step apart) against the same eight x rows: each x vector
// is loaded once for the O rows.
// With eight x rows the pass loads eight x vectors for every weight vector, and the MLP's second layer
// (3072 inputs: 96 KB of x) does not fit a 48 KB L1, so x came from L2 for every output; two outputs a
// pass halve that. Each output's operations are row_wide's alone, in the same order.
template <int O>
COLOSSAL_INLINE void row_wide(const float* __restrict x, int64_t in, const float* __restrict w, int64_t w_step, const float* bias,
                              float* __restrict y, int64_t y_step, int64_t ldy) {
  constexpr int R = kWideRows;
  wide acc[O][R] = {};
  int64_t i = 0;
  for (; i + 16 <= in; i += 16) {
    wide wv[O];
    for (int o = 0; o < O; ++o) {
      __builtin_prefetch(w + o * w_step + i + kPrefetchFloats, 0, 3);
      wv[o] = load_u<16>(w + o * w_step + i);
    }
    for (int r = 0; r < R; ++r) {
      const wide xv = load_u<16>(x + r * in + i);
      for (int o = 0; o < O; ++o) acc[o][r] = fmadd<16>(wv[o], xv, acc[o][r]);
    }
  }
  for (int o = 0; o < O; ++o) {
    const float* wo = w + o * w_step;
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
      y[o * y_step + r * ldy] = s + bias[o];
    }
  }
}
#endif


// One pass of R x rows over N weight rows: row<R, N> where the registers hold it (gemv picks N so), else
// the rows one at a time (the same bits).
template <int R, int N>
COLOSSAL_INLINE void pass(const float* x, int64_t in, const float* w, int64_t w_step, const float* bias, float* y, int64_t y_step,
                          int64_t ldy, int from_rows) {
  if constexpr (N <= fit_streams(R)) {
    row<R, N>(x, in, w, w_step, bias, y, y_step, ldy, from_rows);
  } else {
    for (int s = 0; s < N; ++s) row<R, 1>(x, in, w + s * w_step, w_step, bias + s, y + s * y_step, y_step, ldy, from_rows);
  }
}

// Outputs [o_begin, o_end) for every x row, S weight rows at a time (in_streams), each group of them in
// passes of up to per_pass <= kRowsPerPass x rows (further passes read the group's rows from L1).
template <int S>
void outputs(const float* x, int64_t rows, int64_t per_pass, int64_t in, const float* w, const float* bias, float* y, int64_t ldy,
             int64_t o_begin, int64_t o_end) {
  const int from_rows = prefetch_one_row() ? 1 : kPrefetchFromRows;
  in_streams<S>(o_begin, o_end, [&]<int N>(int64_t o, int64_t step) {
    float b[N];
    stream_biases(bias, o, step, b);
    const float* wo = w + o * in;
    const int64_t w_step = step * in;
    for (int64_t r = 0; r < rows; r += per_pass) {
      const float* xr = x + r * in;
      float* yr = y + r * ldy + o;
      switch (rows - r < per_pass ? rows - r : per_pass) {
        case 1: pass<1, N>(xr, in, wo, w_step, b, yr, step, ldy, from_rows); break;
        case 2: pass<2, N>(xr, in, wo, w_step, b, yr, step, ldy, from_rows); break;
        case 3: pass<3, N>(xr, in, wo, w_step, b, yr, step, ldy, from_rows); break;
        case 4: pass<4, N>(xr, in, wo, w_step, b, yr, step, ldy, from_rows); break;
        case 5: if constexpr (kRowsPerPass > 4) pass<5, N>(xr, in, wo, w_step, b, yr, step, ldy, from_rows); break;
        case 6: if constexpr (kRowsPerPass > 4) pass<6, N>(xr, in, wo, w_step, b, yr, step, ldy, from_rows); break;
        case 7: if constexpr (kRowsPerPass > 4) pass<7, N>(xr, in, wo, w_step, b, yr, step, ldy, from_rows); break;
        default:
#if defined(__AVX512F__)
          if constexpr (kRowsPerPass == kWideRows) {
            for (int s = 0; s < N; ++s) row_wide<1>(xr, in, wo + s * w_step, w_step, b + s, yr + s * step, step, ldy);
            break;
          }
#endif
          pass<kRowsPerPass, N>(xr, in, wo, w_step, b, yr, step, ldy, from_rows);
          break;
      }
    }
  });
}

}  // namespace

void gemv(const float* x, int64_t rows, int64_t in, const float* w, const float* bias, float* y, int64_t ldy,
          int64_t o_begin, int64_t o_end) {
  const int streams = weight_streams();
#if defined(__AVX512F__)
  if (kRowsPerPass == kWideRows && rows % kWideRows == 0) {   // whole passes of eight x rows: several outputs at a time
    const auto wide = [&]<int N>(int64_t o, int64_t step) {
      float b[N];
      stream_biases(bias, o, step, b);
      for (int64_t r = 0; r < rows; r += kWideRows) row_wide<N>(x + r * in, in, w + o * in, step * in, b, y + r * ldy + o, step, ldy);
    };
    if (streams > 1) {   // outputs from two or three stretches of the range (weight_streams.h)
      if (streams >= kWideStreams) in_streams<kWideStreams>(o_begin, o_end, wide);
      else in_streams<2>(o_begin, o_end, wide);
      return;
    }
    int64_t o = o_begin;   // neighbouring pairs, one stream
    for (; o + 2 <= o_end; o += 2) wide.template operator()<2>(o, 1);
    if (o < o_end) wide.template operator()<1>(o, 0);
    return;
  }
#endif
  int64_t per_pass = rows < kRowsPerPass ? rows : kRowsPerPass;
  if (streams > 1 && fit_streams(static_cast<int>(per_pass)) == 1) {
    // Shorter passes that hold two streams (AVX2's 16 registers: up to three x rows), the same number of
    // multiply-adds, the later passes' weights from L1. On an Intel Xeon capped to AVX2, four sequences
    // decoded at 0.67 of the bandwidth bound in one pass of four from one stream.
    const int64_t passes = (rows + kStreamPassRows - 1) / kStreamPassRows;
    per_pass = (rows + passes - 1) / passes;
  }
  const int fit = fit_streams(static_cast<int>(per_pass));
  switch (streams < fit ? streams : fit) {
    case 4: outputs<4>(x, rows, per_pass, in, w, bias, y, ldy, o_begin, o_end); break;
    case 3: outputs<3>(x, rows, per_pass, in, w, bias, y, ldy, o_begin, o_end); break;
    case 2: outputs<2>(x, rows, per_pass, in, w, bias, y, ldy, o_begin, o_end); break;
    default: outputs<1>(x, rows, per_pass, in, w, bias, y, ldy, o_begin, o_end); break;
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
