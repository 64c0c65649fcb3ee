// Causal attention for short sequences, one instruction set's copy of the per-head loops: see
// attention.h for the algorithm and layouts, attention.cpp for threading and scratch.
//
// Register blocking follows the set (simd.h): a vector is kLanes floats and kRegs of them fit. Head
// dimensions 16, 32, 64 and 128 run register-blocked loops whose row blocks are sized so that their
// accumulators and operands never exceed kRegs (AVX2 has 16 registers of 8 floats, AVX-512 32 of 16:
// a block sized for one spills on the other). Other head dimensions run plain loops over contiguous
// axes that the compiler vectorises.
#include <cmath>

#include "kernels/cpu/isa_entry.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/vec_math.h"

namespace colossal::kernels::COLOSSAL_ISA {
namespace {

inline int64_t padded(int64_t n) { return (n + kAttentionPad - 1) / kAttentionPad * kAttentionPad; }

// ---- any head dimension -------------------------------------------------------------------------

// rows [n][d] with row stride `stride` -> dst [d][ld] (the key axis contiguous).
void transpose_rows(const float* src, int64_t stride, int64_t n, int64_t d, int64_t ld, float* dst) {
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
  const int64_t ld = padded(t_len);
  float *kt = w.kt, *s = w.p;
  transpose_rows(h.k, h.stride, t_len, d, ld, kt);
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
  const int64_t ld = padded(t_len);
  float *kt = w.kt, *vt = w.vt, *p = w.p, *dp = w.dp, *dk_acc = w.dk, *dv_acc = w.dv;
  transpose_rows(h.k, h.stride, t_len, d, ld, kt);
  transpose_rows(h.v, h.stride, t_len, d, ld, vt);
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

// Accumulator blocks, in vectors: the forward's P.V keeps two sets of kPvBlock accumulators (two keys
// in flight hide the add latency); the backward's key loop keeps q, dO and the dQ accumulator of
// kBwdBlock vectors each, plus two broadcasts. Both stay within kRegs with room for operands.
// Blocks are powers of two, so they divide every register-blocked row (D / kLanes vectors).
constexpr int pow2_floor(int x) { return x < 2 ? 1 : 2 * pow2_floor(x / 2); }
constexpr int kPvBlock = kRegs / 4;                     // 4 on AVX2/SSE (2 x 4 live), 8 on AVX-512 (2 x 8)
constexpr int kBwdBlock = pow2_floor((kRegs - 4) / 3);  // 4 on AVX2/SSE (14 live), 8 on AVX-512 (26 live)
constexpr int kScoreKeys = 4;                           // key vectors scored at once (independent accumulators)

template <int N>
constexpr int block_of(int nv) { return nv < N ? nv : N; }

// rows [n][D] (stride apart) -> dst [D][ld], zero beyond n, so whole vectors of keys never read garbage.
template <int D>
void transpose_padded(const float* src, int64_t stride, int64_t n, int64_t ld, float* dst) {
  for (int64_t c = 0; c < D; ++c)
    for (int64_t j = n; j < ld; ++j) dst[c * ld + j] = 0.0f;
  for (int64_t j = 0; j < n; ++j)
    for (int64_t c = 0; c < D; ++c) dst[c * ld + j] = src[j * stride + c];
}

// s[0, n rounded up to kLanes) = scale * a . bt[:, j]. Each key's score sums c in order in one chain.
template <int D>
COLOSSAL_INLINE void scores(const float* a, const float* bt, int64_t ld, int64_t n, float scale, float* s) {
  float as[D];
  for (int c = 0; c < D; ++c) as[c] = a[c] * scale;
  const int64_t end = (n + kLanes - 1) / kLanes * kLanes;
  int64_t j = 0;
  for (; j + kScoreKeys * kLanes <= end; j += kScoreKeys * kLanes) {
    vf acc[kScoreKeys] = {};
    for (int c = 0; c < D; ++c) {
      const vf x = splat(as[c]);
      const float* row = bt + c * ld + j;
      for (int u = 0; u < kScoreKeys; ++u) acc[u] += x * load_u(row + u * kLanes);
    }
    for (int u = 0; u < kScoreKeys; ++u) store_u(s + j + u * kLanes, acc[u]);
  }
  for (; j < end; j += kLanes) {
    vf acc = vf{};
    for (int c = 0; c < D; ++c) acc += splat(as[c]) * load_u(bt + c * ld + j);
    store_u(s + j, acc);
  }
}

template <int D>
void forward_vec(const AttentionHead& h, float* __restrict out, float* __restrict lse, int64_t t_len, float scale,
                 const AttentionScratch& w) {
  constexpr int nv = D / kLanes, nb = block_of<kPvBlock>(nv);
  const int64_t ld = padded(t_len);
  float *kt = w.kt, *s = w.p;
  transpose_padded<D>(h.k, h.stride, t_len, ld, kt);
  for (int64_t i = 0; i < t_len; ++i) {
    const int64_t n = i + 1;
    scores<D>(h.q + i * h.stride, kt, ld, n, scale, s);
    float max;
    const float sum = exp_shifted_inplace(s, n, max);
    const vf inv = splat(1.0f / sum);
    float* oi = out + i * h.out_stride;
    for (int r0 = 0; r0 < nv; r0 += nb) {   // O_i[r0 block] = sum_j p_j v_j[r0 block]
      vf o0[nb] = {}, o1[nb] = {};
      int64_t j = 0;
      for (; j + 1 < n; j += 2) {
        const vf p0 = splat(s[j]), p1 = splat(s[j + 1]);
        const float* v0 = h.v + j * h.stride + r0 * kLanes;
        const float* v1 = v0 + h.stride;
        for (int r = 0; r < nb; ++r) {
          o0[r] += p0 * load_u(v0 + r * kLanes);
          o1[r] += p1 * load_u(v1 + r * kLanes);
        }
      }
      if (j < n) {
        const vf p0 = splat(s[j]);
        const float* v0 = h.v + j * h.stride + r0 * kLanes;
        for (int r = 0; r < nb; ++r) o0[r] += p0 * load_u(v0 + r * kLanes);
      }
      for (int r = 0; r < nb; ++r) store_u(oi + (r0 + r) * kLanes, (o0[r] + o1[r]) * inv);
    }
    lse[i] = max + std::log(sum);
  }
}

template <int D>
void backward_vec(const AttentionHead& h, const float* __restrict out, const float* __restrict d_out,
                  const float* __restrict lse, float* __restrict dq, float* __restrict dk, float* __restrict dv,
                  int64_t t_len, float scale, const AttentionScratch& w) {
  constexpr int nv = D / kLanes, nb = block_of<kBwdBlock>(nv);
  const int64_t ld = padded(t_len);
  float *kt = w.kt, *vt = w.vt, *p = w.p, *dp = w.dp, *dk_acc = w.dk, *dv_acc = w.dv;
  transpose_padded<D>(h.k, h.stride, t_len, ld, kt);
  transpose_padded<D>(h.v, h.stride, t_len, ld, vt);
  for (int64_t j = 0; j < t_len * D; ++j) dk_acc[j] = dv_acc[j] = 0.0f;
  for (int64_t i = 0; i < t_len; ++i) {
    const int64_t n = i + 1;
    const float* qi = h.q + i * h.stride;
    const float* goi = d_out + i * h.out_stride;
    const float* oi = out + i * h.out_stride;
    scores<D>(qi, kt, ld, n, scale, p);
    exp_minus(p, n, lse[i]);
    scores<D>(goi, vt, ld, n, 1.0f, dp);   // dp_ij = dO_i . v_j
    vf dlt = vf{};
    for (int r = 0; r < nv; ++r) dlt += load_u(goi + r * kLanes) * load_u(oi + r * kLanes);
    softmax_grad(p, dp, n, hsum(dlt), scale);   // D_i = dO_i . O_i
    for (int r0 = 0; r0 < nv; r0 += nb) {
      vf q[nb], g[nb], acc[nb] = {};
      for (int r = 0; r < nb; ++r) {
        q[r] = load_u(qi + (r0 + r) * kLanes);
        g[r] = load_u(goi + (r0 + r) * kLanes);
      }
      for (int64_t j = 0; j < n; ++j) {
        const vf ds = splat(dp[j]), pj = splat(p[j]);
        const float* kj = h.k + j * h.stride + r0 * kLanes;
        float* dkj = dk_acc + j * D + r0 * kLanes;
        float* dvj = dv_acc + j * D + r0 * kLanes;
        for (int r = 0; r < nb; ++r) {
          acc[r] += ds * load_u(kj + r * kLanes);                                // dQ_i += dS_ij k_j
          store_u(dkj + r * kLanes, load_u(dkj + r * kLanes) + ds * q[r]);      // dK_j += dS_ij q_i
          store_u(dvj + r * kLanes, load_u(dvj + r * kLanes) + pj * g[r]);      // dV_j += p_ij dO_i
        }
      }
      for (int r = 0; r < nb; ++r) store_u(dq + i * h.stride + (r0 + r) * kLanes, acc[r]);
    }
  }
  for (int64_t j = 0; j < t_len; ++j)
    for (int r = 0; r < nv; ++r) {
      store_u(dk + j * h.stride + r * kLanes, load_u(dk_acc + j * D + r * kLanes));
      store_u(dv + j * h.stride + r * kLanes, load_u(dv_acc + j * D + r * kLanes));
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
