// Causal attention for short sequences, one instruction set's copy of the per-head loops: see
// attention.h for the algorithm and layouts, attention.cpp for threading and scratch.
//
// Register blocking follows the set (simd.h): a vector is kLanes floats and kRegs of them fit. Head
// dimensions 16, 32, 64 and 128 run register-blocked loops over blocks of queries, whose row and
// column blocks are sized so that their accumulators and operands never exceed kRegs (AVX2 has 16
// registers of 8 floats, AVX-512 32 of 16: a block sized for one spills on the other). Other head
// dimensions run plain loops over contiguous axes that the compiler vectorises.
#include <cmath>

#include "kernels/cpu/isa_entry.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/vec_math.h"

namespace colossal::kernels::COLOSSAL_ISA {
namespace {

// ---- any head dimension -------------------------------------------------------------------------

// rows [n][d] (stride apart) -> dst [d][ld] (the key axis contiguous), zero beyond n, so whole vectors
// of keys never read garbage.
void transpose_padded(const float* src, int64_t stride, int64_t n, int64_t d, int64_t ld, float* dst) {
  for (int64_t c = 0; c < d; ++c)
    for (int64_t j = n; j < ld; ++j) dst[c * ld + j] = 0.0f;
  for (int64_t j = 0; j < n; ++j)
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

// s[j] = exp(s[j] - max) over [0, n), with max the row's maximum; returns the sum (softmax's denominator).
COLOSSAL_INLINE float exp_shifted_inplace(float* __restrict s, int64_t n, float& max) {
  max = s[0];
#pragma omp simd reduction(max : max)
  for (int64_t j = 0; j < n; ++j) max = s[j] > max ? s[j] : max;
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < n; ++j) {
    s[j] = exp_nonpositive(s[j] - max);
    sum += s[j];
  }
  return sum;
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
// Queries go QB at a time (kQueryBlock rows: 4 with 32 registers, 2 with 16), so every pass over the
// transposed keys and values, and every read-modify-write of a key's dK and dV accumulators, serves QB
// queries: at T=256, D=64 those buffers are 64 KB each and live in L2, and one query per pass made the
// kernel L2-bound. Rows past the block's causal limit carry p = dS = 0. Blocks of vectors are sized so
// accumulators, operands and broadcasts stay within kRegs:
//   scores: QB x kScoreKeys accumulators; P.V: QB x kPvBlock; backward's key loop: q, dO and dQ of QB
//   rows x kBwdBlock vectors, plus 2 QB broadcasts.
constexpr int kQueryBlock = kRegs >= 32 ? 4 : 2;
constexpr int kScoreKeys = 8 / kQueryBlock;   // 8 accumulators in flight hide the FMA latency
constexpr int kPvBlock = 4;                   // 16 + 4 + 4 live on AVX-512, 8 + 4 + 2 on AVX2/SSE
constexpr int kBwdBlock = 1;                  // 12 + 8 + 3 live on AVX-512, 6 + 4 + 3 on AVX2/SSE
static_assert(kAttentionRows >= kQueryBlock, "scratch rows must hold a query block");

template <int N>
constexpr int block_of(int nv) { return nv < N ? nv : N; }

// s[q][0, n rounded up to kLanes) = scale * a_q . bt[:, j] for QB rows a_q (`a_stride` apart); rows of
// s are `ld` apart. Each score sums c in order in one chain.
template <int D, int QB>
COLOSSAL_INLINE void scores(const float* a, int64_t a_stride, const float* bt, int64_t ld, int64_t n, float scale,
                            float* s) {
  float as[QB][D];
  for (int q = 0; q < QB; ++q)
    for (int c = 0; c < D; ++c) as[q][c] = a[q * a_stride + c] * scale;
  const int64_t end = (n + kLanes - 1) / kLanes * kLanes;
  constexpr int U = QB == 1 ? 4 : kScoreKeys;
  int64_t j = 0;
  for (; j + U * kLanes <= end; j += U * kLanes) {
    vf acc[QB][U] = {};
    for (int c = 0; c < D; ++c) {
      vf k[U];
      for (int u = 0; u < U; ++u) k[u] = load_u(bt + c * ld + j + u * kLanes);
      for (int q = 0; q < QB; ++q) {
        const vf x = splat(as[q][c]);
        for (int u = 0; u < U; ++u) acc[q][u] += x * k[u];
      }
    }
    for (int q = 0; q < QB; ++q)
      for (int u = 0; u < U; ++u) store_u(s + q * ld + j + u * kLanes, acc[q][u]);
  }
  for (; j < end; j += kLanes) {
    vf acc[QB] = {};
    for (int c = 0; c < D; ++c) {
      const vf k = load_u(bt + c * ld + j);
      for (int q = 0; q < QB; ++q) acc[q] += splat(as[q][c]) * k;
    }
    for (int q = 0; q < QB; ++q) store_u(s + q * ld + j, acc[q]);
  }
}

// Zeroes row q of a block beyond its causal limit: s[q][i0 + q + 1, n).
template <int QB>
COLOSSAL_INLINE void zero_beyond_causal(float* s, int64_t ld, int64_t i0, int64_t n) {
  for (int q = 0; q < QB; ++q)
    for (int64_t j = i0 + q + 1; j < n; ++j) s[q * ld + j] = 0.0f;
}

// Queries [i0, i0 + QB): out, lse.
template <int D, int QB>
COLOSSAL_INLINE void forward_rows(const AttentionHead& h, float* __restrict out, float* __restrict lse, int64_t i0,
                                  int64_t ld, float scale, const float* kt, float* s) {
  constexpr int nv = D / kLanes, nb = block_of<kPvBlock>(nv);
  const int64_t n = i0 + QB;   // keys the block's last row sees
  scores<D, QB>(h.q + i0 * h.stride, h.stride, kt, ld, n, scale, s);
  float inv[QB];
  for (int q = 0; q < QB; ++q) {
    float max;
    const float sum = exp_shifted_inplace(s + q * ld, i0 + q + 1, max);
    inv[q] = 1.0f / sum;
    lse[i0 + q] = max + std::log(sum);
  }
  zero_beyond_causal<QB>(s, ld, i0, n);
  for (int r0 = 0; r0 < nv; r0 += nb) {   // O_q[r0 block] = sum_j p_qj v_j[r0 block]
    vf o[QB][nb] = {};
    for (int64_t j = 0; j < n; ++j) {
      const float* vj = h.v + j * h.stride + r0 * kLanes;
      vf v[nb];
      for (int r = 0; r < nb; ++r) v[r] = load_u(vj + r * kLanes);
      for (int q = 0; q < QB; ++q) {
        const vf p = splat(s[q * ld + j]);
        for (int r = 0; r < nb; ++r) o[q][r] += p * v[r];
      }
    }
    for (int q = 0; q < QB; ++q) {
      float* oq = out + (i0 + q) * h.out_stride + r0 * kLanes;
      for (int r = 0; r < nb; ++r) store_u(oq + r * kLanes, o[q][r] * splat(inv[q]));
    }
  }
}

template <int D>
void forward_vec(const AttentionHead& h, float* __restrict out, float* __restrict lse, int64_t t_len, float scale,
                 const AttentionScratch& w) {
  const int64_t ld = attention_ld(t_len);
  transpose_padded(h.k, h.stride, t_len, D, ld, w.kt);
  int64_t i = 0;
  for (; i + kQueryBlock <= t_len; i += kQueryBlock) forward_rows<D, kQueryBlock>(h, out, lse, i, ld, scale, w.kt, w.p);
  for (; i < t_len; ++i) forward_rows<D, 1>(h, out, lse, i, ld, scale, w.kt, w.p);
}

// Queries [i0, i0 + QB): dQ written, dK and dV accumulated into w.dk and w.dv ([T][D]).
template <int D, int QB>
COLOSSAL_INLINE void backward_rows(const AttentionHead& h, const float* __restrict out, const float* __restrict d_out,
                                   const float* __restrict lse, float* __restrict dq, int64_t i0, int64_t ld,
                                   float scale, const AttentionScratch& w) {
  constexpr int nv = D / kLanes, nb = block_of<kBwdBlock>(nv);
  const int64_t n = i0 + QB;
  float *p = w.p, *dp = w.dp;
  scores<D, QB>(h.q + i0 * h.stride, h.stride, w.kt, ld, n, scale, p);
  scores<D, QB>(d_out + i0 * h.out_stride, h.out_stride, w.vt, ld, n, 1.0f, dp);   // dp_qj = dO_q . v_j
  for (int q = 0; q < QB; ++q) {
    const int64_t i = i0 + q;
    exp_minus(p + q * ld, i + 1, lse[i]);
    const float* goi = d_out + i * h.out_stride;
    const float* oi = out + i * h.out_stride;
    vf dlt = vf{};
    for (int r = 0; r < nv; ++r) dlt += load_u(goi + r * kLanes) * load_u(oi + r * kLanes);
    softmax_grad(p + q * ld, dp + q * ld, i + 1, hsum(dlt), scale);   // D_i = dO_i . O_i
  }
  zero_beyond_causal<QB>(p, ld, i0, n);
  zero_beyond_causal<QB>(dp, ld, i0, n);
  for (int r0 = 0; r0 < nv; r0 += nb) {
    vf qv[QB][nb], g[QB][nb], acc[QB][nb] = {};
    for (int q = 0; q < QB; ++q)
      for (int r = 0; r < nb; ++r) {
        qv[q][r] = load_u(h.q + (i0 + q) * h.stride + (r0 + r) * kLanes);
        g[q][r] = load_u(d_out + (i0 + q) * h.out_stride + (r0 + r) * kLanes);
      }
    for (int64_t j = 0; j < n; ++j) {
      const float* kj = h.k + j * h.stride + r0 * kLanes;
      float* dkj = w.dk + j * D + r0 * kLanes;
      float* dvj = w.dv + j * D + r0 * kLanes;
      for (int r = 0; r < nb; ++r) {
        const vf k = load_u(kj + r * kLanes);
        vf dk = load_u(dkj + r * kLanes), dv = load_u(dvj + r * kLanes);
        for (int q = 0; q < QB; ++q) {
          const vf ds = splat(dp[q * ld + j]), pq = splat(p[q * ld + j]);
          acc[q][r] += ds * k;        // dQ_q += dS_qj k_j
          dk += ds * qv[q][r];        // dK_j += dS_qj q_q
          dv += pq * g[q][r];         // dV_j += p_qj dO_q
        }
        store_u(dkj + r * kLanes, dk);
        store_u(dvj + r * kLanes, dv);
      }
    }
    for (int q = 0; q < QB; ++q)
      for (int r = 0; r < nb; ++r) store_u(dq + (i0 + q) * h.stride + (r0 + r) * kLanes, acc[q][r]);
  }
}

template <int D>
void backward_vec(const AttentionHead& h, const float* __restrict out, const float* __restrict d_out,
                  const float* __restrict lse, float* __restrict dq, float* __restrict dk, float* __restrict dv,
                  int64_t t_len, float scale, const AttentionScratch& w) {
  constexpr int nv = D / kLanes;
  const int64_t ld = attention_ld(t_len);
  transpose_padded(h.k, h.stride, t_len, D, ld, w.kt);
  transpose_padded(h.v, h.stride, t_len, D, ld, w.vt);
  for (int64_t j = 0; j < t_len * D; ++j) w.dk[j] = w.dv[j] = 0.0f;
  int64_t i = 0;
  for (; i + kQueryBlock <= t_len; i += kQueryBlock) backward_rows<D, kQueryBlock>(h, out, d_out, lse, dq, i, ld, scale, w);
  for (; i < t_len; ++i) backward_rows<D, 1>(h, out, d_out, lse, dq, i, ld, scale, w);
  for (int64_t j = 0; j < t_len; ++j)
    for (int r = 0; r < nv; ++r) {
      store_u(dk + j * h.stride + r * kLanes, load_u(w.dk + j * D + r * kLanes));
      store_u(dv + j * h.stride + r * kLanes, load_u(w.dv + j * D + r * kLanes));
    }
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
