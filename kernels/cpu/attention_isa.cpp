// Causal attention for short sequences, one instruction set's copy of the per-head loops: see
// attention.h for the algorithm and layouts, attention.cpp for threading and scratch.
//
// Register blocking follows the set (simd.h): a vector is kLanes floats and kRegs of them fit. Head
// dimensions 16, 32, 64 and 128 run every product through one register tile whose rows and vectors
// are sized so that accumulators and operands never exceed kRegs (AVX2 has 16 registers of 8 floats,
// AVX-512 32 of 16: a tile sized for one spills on the other). Other head dimensions run plain loops
// over contiguous axes that the compiler vectorises.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/isa_entry.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/transpose_isa.h"
#include "kernels/cpu/vec_math.h"

namespace colossal::kernels::COLOSSAL_ISA {
namespace {

// ---- any head dimension -------------------------------------------------------------------------

// rows [n][d] (stride apart) -> dst [d][ld] (the key axis contiguous), zero beyond n, so whole vectors
// of keys never read garbage. Whole 8 x 8 blocks go through registers where the set has them: the
// scalar loop's strided loads of rows not yet in cache were a fifth of the backward's time.
void transpose_padded(const float* src, int64_t stride, int64_t n, int64_t d, int64_t ld, float* dst) {
  for (int64_t c = 0; c < d; ++c)
    for (int64_t j = n; j < ld; ++j) dst[c * ld + j] = 0.0f;
  int64_t j0 = 0;
#if defined(__AVX2__)
  const int64_t c0 = d / 8 * 8;
  for (; j0 + 8 <= n; j0 += 8)
    for (int64_t c = 0; c < c0; c += 8) transpose_8x8(src + j0 * stride + c, stride, dst + c * ld + j0, ld);
  for (int64_t j = 0; j < j0; ++j)   // columns past the last whole block
    for (int64_t c = c0; c < d; ++c) dst[c * ld + j] = src[j * stride + c];
#endif
  for (int64_t j = j0; j < n; ++j)
    for (int64_t c = 0; c < d; ++c) dst[c * ld + j] = src[j * stride + c];
}

// s[0, n) = scale * sum_c a[c] * bt[c][0, n): one query (or dO row) against n transposed keys (values).
COLOSSAL_INLINE void row_times_transposed(const float* __restrict a, const float* __restrict bt, int64_t ld,
                                          int64_t n, int64_t d, float scale, float* __restrict s) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) s[j] = 0.0f;
  for (int64_t c = 0; c < d; ++c) {
    const float x = a[c] * scale;
    const float* __restrict row = bt + c * ld;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) s[j] += x * row[j];
  }
}

// p[j] = exp(s[j] - lse) over [0, n): the softmax row recomputed from its saved log-sum-exp.
COLOSSAL_INLINE void exp_minus(float* __restrict s, int64_t n, float lse) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) s[j] = exp_nonpositive(s[j] - lse);
}

// ds[j] = p[j] (dp[j] - delta) scale: dS with the score scale folded in (for both dQ and dK).
COLOSSAL_INLINE void softmax_grad(const float* __restrict p, float* __restrict dp, int64_t n, float delta, float scale) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) dp[j] = p[j] * (dp[j] - delta) * scale;
}

// y[0, d) += x * a[0, d)
COLOSSAL_INLINE void axpy(float x, const float* __restrict a, float* __restrict y, int64_t d) {
#pragma omp simd
  for (int64_t c = 0; c < d; ++c) y[c] += x * a[c];
}

void forward_generic(const AttentionHead& h, float* __restrict out, float* __restrict lse, int64_t t_len, int64_t d,
                     float scale, const AttentionScratch& w) {
  const int64_t ld = attention_ld(t_len);
  float *kt = w.kt, *s = w.p;
  transpose_padded(h.k, h.stride, t_len, d, ld, kt);
  for (int64_t i = 0; i < t_len; ++i) {
    const int64_t n = i + 1;   // causal: keys 0..i
    row_times_transposed(h.q + i * h.stride, kt, ld, n, d, scale, s);
    float max;
    const float sum = exp_shifted_inplace(s, n, max);
    const float inv = 1.0f / sum;
    float* __restrict o = out + i * h.out_stride;
#pragma omp simd
    for (int64_t c = 0; c < d; ++c) o[c] = 0.0f;
    for (int64_t j = 0; j < n; ++j) axpy(s[j] * inv, h.v + j * h.stride, o, d);
    lse[i] = max + std::log(sum);
  }
}

void backward_generic(const AttentionHead& h, const float* __restrict out, const float* __restrict d_out,
                      const float* __restrict lse, float* __restrict dq, float* __restrict dk, float* __restrict dv,
                      int64_t t_len, int64_t d, float scale, const AttentionScratch& w) {
  const int64_t ld = attention_ld(t_len);
  float *kt = w.kt, *vt = w.vt, *p = w.p, *dp = w.dp, *dk_acc = w.dk, *dv_acc = w.dv;
  transpose_padded(h.k, h.stride, t_len, d, ld, kt);
  transpose_padded(h.v, h.stride, t_len, d, ld, vt);
  for (int64_t j = 0; j < t_len * d; ++j) dk_acc[j] = dv_acc[j] = 0.0f;
  for (int64_t i = 0; i < t_len; ++i) {
    const int64_t n = i + 1;
    const float* __restrict qi = h.q + i * h.stride;
    const float* __restrict oi = out + i * h.out_stride;
    const float* __restrict goi = d_out + i * h.out_stride;
    row_times_transposed(qi, kt, ld, n, d, scale, p);
    exp_minus(p, n, lse[i]);
    row_times_transposed(goi, vt, ld, n, d, 1.0f, dp);   // dp_ij = dO_i . v_j
    float delta = 0.0f;                                    // D_i = dO_i . O_i = sum_j p_ij dp_ij
#pragma omp simd reduction(+ : delta)
    for (int64_t c = 0; c < d; ++c) delta += goi[c] * oi[c];
    softmax_grad(p, dp, n, delta, scale);
    float* __restrict dqi = dq + i * h.stride;
#pragma omp simd
    for (int64_t c = 0; c < d; ++c) dqi[c] = 0.0f;
    for (int64_t j = 0; j < n; ++j) {
      axpy(dp[j], h.k + j * h.stride, dqi, d);   // dQ_i += dS_ij k_j
      axpy(dp[j], qi, dk_acc + j * d, d);         // dK_j += dS_ij q_i
      axpy(p[j], goi, dv_acc + j * d, d);         // dV_j += p_ij dO_i
    }
  }
  for (int64_t j = 0; j < t_len; ++j)
    for (int64_t c = 0; c < d; ++c) {
      dk[j * h.stride + c] = dk_acc[j * d + c];
      dv[j * h.stride + c] = dv_acc[j * d + c];
    }
}

// ---- head dimension D, register-blocked ---------------------------------------------------------
//
// Every product of a head is a small GEMM (scores Q.K^T and dO.V^T, then P.V, dS.K, dS^T.Q and P^T.dO),
// and each runs through one register tile: kTileRows rows by up to kTileVecs vectors of accumulators,
// fed per step by kTileVecs vector loads and one broadcast per row, so the accumulators, operands and
// broadcast stay within kRegs (AVX2/SSE 6 x 2 = 12 + 2 + 1 of 16; AVX-512 8 x 2 = 16 + 2 + 1 of 32, which
// measured as fast as 6 x 2 and 6 x 4 and faster than 12 x 2 at D 32 and 64). Causality is kept per tile:
// a tile of queries reads only the keys its last row sees.
constexpr int kTileRows = kRegs >= 32 ? 8 : 6;
constexpr int kTileVecs = 2;
// The backward takes queries in blocks of kAttentionRows (a multiple of the tile, so key tiles and query
// tiles line up; see backward_block): each block's dK and dV sums are read and written once per block.
static_assert(kAttentionRows % kTileRows == 0, "query blocks must hold whole tiles");

COLOSSAL_INLINE int64_t round_up_lanes(int64_t n) { return (n + kLanes - 1) / kLanes * kLanes; }

// c[r][v] = alpha * sum_k a[r*ar + k*ak] * b[k*bk + v*kLanes] (plus c's old value if Acc), for R rows and
// V vectors; each element sums k in order in one chain.
template <int R, int V, bool Acc>
COLOSSAL_INLINE void tile(const float* a, int64_t ar, int64_t ak, const float* b, int64_t bk, int64_t kn, float alpha,
                          float* c, int64_t cr) {
  vf acc[R][V] = {};
  for (int64_t k = 0; k < kn; ++k) {
    vf bv[V];
    for (int v = 0; v < V; ++v) bv[v] = load_u(b + k * bk + v * kLanes);
    for (int r = 0; r < R; ++r) {
      const vf x = splat(a[r * ar + k * ak]);
      for (int v = 0; v < V; ++v) acc[r][v] += x * bv[v];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) {
      float* y = c + r * cr + v * kLanes;
      vf sum = acc[r][v] * alpha;
      if constexpr (Acc) sum += load_u(y);
      store_u(y, sum);
    }
}

// tile<rows, V, Acc> for any rows in [1, R]: full tiles take the first test, edges step down.
template <int V, bool Acc, int R = kTileRows>
void tile_rows(int rows, const float* a, int64_t ar, int64_t ak, const float* b, int64_t bk, int64_t kn, float alpha,
               float* c, int64_t cr) {
  if constexpr (R > 1)
    if (rows < R) return tile_rows<V, Acc, R - 1>(rows, a, ar, ak, b, bk, kn, alpha, c, cr);
  tile<R, V, Acc>(a, ar, ak, b, bk, kn, alpha, c, cr);
}

// `rows` rows (< kTileRows + 1) of c by nv vectors: tiles of kTileVecs vectors, then one of a single vector.
template <bool Acc>
void gemm_rows(int rows, int64_t nv, const float* a, int64_t ar, int64_t ak, const float* b, int64_t bk, int64_t kn,
               float alpha, float* c, int64_t cr) {
  static_assert(kTileVecs == 2, "the edge below is one vector");
  int64_t v = 0;
  for (; v + kTileVecs <= nv; v += kTileVecs)
    tile_rows<kTileVecs, Acc>(rows, a, ar, ak, b + v * kLanes, bk, kn, alpha, c + v * kLanes, cr);
  if (v < nv) tile_rows<1, Acc>(rows, a, ar, ak, b + v * kLanes, bk, kn, alpha, c + v * kLanes, cr);
}

// Marks a score row's keys past the causal limit `valid` (up to the tile's padded end e) as -inf.
COLOSSAL_INLINE void mask_after(float* s, int64_t valid, int64_t e) {
  for (int64_t j = valid; j < e; ++j) s[j] = -INFINITY;
}
COLOSSAL_INLINE void zero_after(float* s, int64_t valid, int64_t e) {
  for (int64_t j = valid; j < e; ++j) s[j] = 0.0f;
}

template <int D>
void forward_vec(const AttentionHead& h, float* __restrict out, float* __restrict lse, int64_t t_len, float scale,
                 const AttentionScratch& w) {
  constexpr int64_t nv = D / kLanes;
  const int64_t ld = attention_ld(t_len);
  transpose_padded(h.k, h.stride, t_len, D, ld, w.kt);
  for (int64_t i = 0; i < t_len; i += kTileRows) {
    const int rows = static_cast<int>(std::min<int64_t>(kTileRows, t_len - i));
    const int64_t n = i + rows, e = round_up_lanes(n);   // keys the tile's last row sees; padded to vectors
    float* s = w.p;
    gemm_rows<false>(rows, e / kLanes, h.q + i * h.stride, h.stride, 1, w.kt, ld, D, scale, s, ld);
    float inv[kTileRows];
    for (int r = 0; r < rows; ++r) {
      float* row = s + r * ld;
      const int64_t valid = i + r + 1;
      mask_after(row, valid, e);
      float max;
      const float sum = exp_shifted_inplace(row, e, max);   // unnormalised: O's rows are scaled instead
      zero_after(row, valid, e);
      inv[r] = 1.0f / sum;
      lse[i + r] = max + std::log(sum);
    }
    float* o = out + i * h.out_stride;
    gemm_rows<false>(rows, nv, s, ld, 1, h.v, h.stride, n, 1.0f, o, h.out_stride);   // O = P V
    for (int r = 0; r < rows; ++r)
      for (int64_t v = 0; v < nv; ++v) {
        float* y = o + r * h.out_stride + v * kLanes;
        store_u(y, load_u(y) * inv[r]);
      }
  }
}

// Queries [i0, n): dQ written; dK and dV (zeroed by the caller) gain this block's terms.
template <int D>
COLOSSAL_INLINE void backward_block(const AttentionHead& h, const float* __restrict out, const float* __restrict d_out,
                                    const float* __restrict lse, float* __restrict dq, float* __restrict dk,
                                    float* __restrict dv, int64_t i0, int64_t n, int64_t ld, float scale,
                                    const AttentionScratch& w) {
  constexpr int64_t nv = D / kLanes;
  for (int64_t i = i0; i < n; i += kTileRows) {
    const int rows = static_cast<int>(std::min<int64_t>(kTileRows, n - i));
    const int64_t end = i + rows, e = round_up_lanes(end);
    float *p = w.p + (i - i0) * ld, *ds = w.dp + (i - i0) * ld;
    gemm_rows<false>(rows, e / kLanes, h.q + i * h.stride, h.stride, 1, w.kt, ld, D, scale, p, ld);
    gemm_rows<false>(rows, e / kLanes, d_out + i * h.out_stride, h.out_stride, 1, w.vt, ld, D, 1.0f, ds, ld);   // dP
    for (int r = 0; r < rows; ++r) {
      const int64_t q = i + r, valid = q + 1;
      float *pr = p + r * ld, *dsr = ds + r * ld;
      mask_after(pr, valid, e);
      exp_minus(pr, e, lse[q]);
      zero_after(pr, valid, e);
      const float *goq = d_out + q * h.out_stride, *oq = out + q * h.out_stride;
      vf dlt = vf{};   // D_q = dO_q . O_q
      for (int64_t v = 0; v < nv; ++v) dlt += load_u(goq + v * kLanes) * load_u(oq + v * kLanes);
      softmax_grad(pr, dsr, e, hsum(dlt), scale);   // dS, zero where P is
    }
    gemm_rows<false>(rows, nv, ds, ld, 1, h.k, h.stride, end, 1.0f, dq + i * h.stride, h.stride);   // dQ = dS K
  }
  // dK_j += sum_q dS_qj q_q and dV_j += sum_q P_qj dO_q over keys j < n, in tiles of keys aligned with the
  // query tiles: a key tile starting at j0 reads rows q >= max(i0, j0), all inside query tiles that reach
  // past the key tile, so every entry it reads was computed (and is zero where q < j).
  for (int64_t j0 = 0; j0 < n; j0 += kTileRows) {
    const int rows = static_cast<int>(std::min<int64_t>(kTileRows, n - j0));
    const int64_t q0 = std::max(i0, j0);
    gemm_rows<true>(rows, nv, w.dp + (q0 - i0) * ld + j0, 1, ld, h.q + q0 * h.stride, h.stride, n - q0, 1.0f,
                    dk + j0 * h.stride, h.stride);
    gemm_rows<true>(rows, nv, w.p + (q0 - i0) * ld + j0, 1, ld, d_out + q0 * h.out_stride, h.out_stride, n - q0, 1.0f,
                    dv + j0 * h.stride, h.stride);
  }
}

template <int D>
void backward_vec(const AttentionHead& h, const float* __restrict out, const float* __restrict d_out,
                  const float* __restrict lse, float* __restrict dq, float* __restrict dk, float* __restrict dv,
                  int64_t t_len, float scale, const AttentionScratch& w) {
  const int64_t ld = attention_ld(t_len);
  transpose_padded(h.k, h.stride, t_len, D, ld, w.kt);
  transpose_padded(h.v, h.stride, t_len, D, ld, w.vt);
  for (int64_t j = 0; j < t_len; ++j)
    for (int64_t v = 0; v < D / kLanes; ++v) {
      store_u(dk + j * h.stride + v * kLanes, vf{});
      store_u(dv + j * h.stride + v * kLanes, vf{});
    }
  for (int64_t i0 = 0; i0 < t_len; i0 += kAttentionRows)
    backward_block<D>(h, out, d_out, lse, dq, dk, dv, i0, std::min(i0 + kAttentionRows, t_len), ld, scale, w);
}

}  // namespace

void attention_forward_head(const AttentionHead& h, float* out, float* lse, int64_t t_len, int64_t d, float scale,
                            const AttentionScratch& w) {
  switch (d) {
    case 16: return forward_vec<16>(h, out, lse, t_len, scale, w);
    case 32: return forward_vec<32>(h, out, lse, t_len, scale, w);
    case 64: return forward_vec<64>(h, out, lse, t_len, scale, w);
    case 128: return forward_vec<128>(h, out, lse, t_len, scale, w);
    default: return forward_generic(h, out, lse, t_len, d, scale, w);
  }
}

void attention_backward_head(const AttentionHead& h, const float* out, const float* d_out, const float* lse, float* dq,
                             float* dk, float* dv, int64_t t_len, int64_t d, float scale, const AttentionScratch& w) {
  switch (d) {
    case 16: return backward_vec<16>(h, out, d_out, lse, dq, dk, dv, t_len, scale, w);
    case 32: return backward_vec<32>(h, out, d_out, lse, dq, dk, dv, t_len, scale, w);
    case 64: return backward_vec<64>(h, out, d_out, lse, dq, dk, dv, t_len, scale, w);
    case 128: return backward_vec<128>(h, out, d_out, lse, dq, dk, dv, t_len, scale, w);
    default: return backward_generic(h, out, d_out, lse, dq, dk, dv, t_len, d, scale, w);
  }
}

}  // namespace colossal::kernels::COLOSSAL_ISA
