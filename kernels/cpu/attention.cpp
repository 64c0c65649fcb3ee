// Causal attention for short sequences, CPU: see attention.h. Every inner loop runs over a
// contiguous axis (keys j against a transposed K or V, or the head dimension d), so the compiler
// vectorises it; target_clones builds AVX-512, AVX2 and baseline versions of the per-head loops.
#include "kernels/cpu/attention.h"

#include <cmath>
#include <vector>

#include "kernels/cpu/vec_math.h"

namespace colossal::kernels {
namespace {

// Helpers are inlined into each target clone, so they run with that clone's instruction set.
#define COLOSSAL_INLINE __attribute__((always_inline)) inline

// rows [n][d] with row stride `stride` -> dst [d][n] (row length n, the key axis contiguous).
void transpose_rows(const float* src, int64_t stride, int64_t n, int64_t d, float* dst) {
  for (int64_t j = 0; j < n; ++j)
    for (int64_t c = 0; c < d; ++c) dst[c * n + j] = src[j * stride + c];
}

// s[0, n) = scale * sum_d a[d] * bt[d][0, n): one query (or dO row) against n transposed keys (values).
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

// y[0, d) += x * a[0, d)
COLOSSAL_INLINE void axpy(float x, const float* __restrict a, float* __restrict y, int64_t d) {
#pragma omp simd
  for (int64_t c = 0; c < d; ++c) y[c] += x * a[c];
}

struct Head {
  const float *q, *k, *v;   // row 0 of this (batch, head); rows `stride` apart
  int64_t stride;           // 3C
  int64_t out_stride;       // C
};

__attribute__((target_clones("avx512f", "avx2", "default")))
void forward_head(const Head& h, float* __restrict out, float* __restrict lse, int64_t t_len, int64_t d, float scale,
                  float* __restrict kt, float* __restrict s) {
  transpose_rows(h.k, h.stride, t_len, d, kt);
  for (int64_t i = 0; i < t_len; ++i) {
    const int64_t n = i + 1;   // causal: keys 0..i
    row_times_transposed(h.q + i * h.stride, kt, t_len, n, d, scale, s);
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

struct Scratch {
  std::vector<float> kt, vt, p, dp, dk, dv;
};

__attribute__((target_clones("avx512f", "avx2", "default")))
void backward_head(const Head& h, const float* __restrict out, const float* __restrict d_out, const float* __restrict lse,
                   float* __restrict dq, float* __restrict dk, float* __restrict dv, int64_t t_len, int64_t d, float scale,
                   Scratch& w) {
  float *kt = w.kt.data(), *vt = w.vt.data(), *p = w.p.data(), *dp = w.dp.data();
  float *dk_acc = w.dk.data(), *dv_acc = w.dv.data();
  transpose_rows(h.k, h.stride, t_len, d, kt);
  transpose_rows(h.v, h.stride, t_len, d, vt);
  for (int64_t j = 0; j < t_len * d; ++j) dk_acc[j] = dv_acc[j] = 0.0f;
  for (int64_t i = 0; i < t_len; ++i) {
    const int64_t n = i + 1;
    const float* __restrict qi = h.q + i * h.stride;
    const float* __restrict oi = out + i * h.out_stride;
    const float* __restrict goi = d_out + i * h.out_stride;
    // p_ij, recomputed from the saved log-sum-exp; dp_ij = dO_i . v_j
    row_times_transposed(qi, kt, t_len, n, d, scale, p);
    const float l = lse[i];
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) p[j] = exp_nonpositive(p[j] - l);
    row_times_transposed(goi, vt, t_len, n, d, 1.0f, dp);
    float delta = 0.0f;   // D_i = dO_i . O_i = sum_j p_ij dp_ij
#pragma omp simd reduction(+ : delta)
    for (int64_t c = 0; c < d; ++c) delta += goi[c] * oi[c];
    // dS_ij = p_ij (dp_ij - D_i); the score scale is folded in here for both dQ and dK.
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) dp[j] = p[j] * (dp[j] - delta) * scale;
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

// Head dimensions of 16, 32, 64 and 128 take register-blocked versions of the same loops, built
// on 16-float GCC vectors (one AVX-512 register, two AVX2 ones): a row of q, k, v or dO is D/16
// vectors kept in registers, and scores come 16 keys at a time from a transposed, zero-padded K.
typedef float vf __attribute__((vector_size(64)));
typedef float vf_u __attribute__((vector_size(64), aligned(4)));   // unaligned rows of qkv
constexpr int64_t kLanes = 16;

COLOSSAL_INLINE vf load_u(const float* p) { return *reinterpret_cast<const vf_u*>(p); }
COLOSSAL_INLINE void store_u(float* p, vf v) { *reinterpret_cast<vf_u*>(p) = v; }
COLOSSAL_INLINE vf splat(float x) { return vf{} + x; }
inline int64_t padded(int64_t n) { return (n + kLanes - 1) / kLanes * kLanes; }

// rows [n][D] (stride apart) -> dst [D][ld], zero beyond n, so 16-key blocks never read garbage.
template <int D>
void transpose_padded(const float* src, int64_t stride, int64_t n, int64_t ld, float* dst) {
  for (int64_t c = 0; c < D; ++c)
    for (int64_t j = n; j < ld; ++j) dst[c * ld + j] = 0.0f;
  for (int64_t j = 0; j < n; ++j)
    for (int64_t c = 0; c < D; ++c) dst[c * ld + j] = src[j * stride + c];
}

// s[0, padded(n)) = scale * a . bt[:, j]
template <int D>
COLOSSAL_INLINE void scores_block(const float* a, const float* bt, int64_t ld, int64_t n, float scale, float* s) {
  float as[D];
  for (int c = 0; c < D; ++c) as[c] = a[c] * scale;
  for (int64_t j = 0; j < n; j += kLanes) {
    vf acc0 = vf{}, acc1 = vf{};   // two chains hide the FMA latency
    for (int c = 0; c < D; c += 2) {
      acc0 += splat(as[c]) * load_u(bt + c * ld + j);
      acc1 += splat(as[c + 1]) * load_u(bt + (c + 1) * ld + j);
    }
    store_u(s + j, acc0 + acc1);
  }
}

template <int D>
__attribute__((target_clones("avx512f", "avx2", "default")))
void forward_head_vec(const Head& h, float* __restrict out, float* __restrict lse, int64_t t_len, float scale,
                      float* __restrict kt, float* __restrict s) {
  constexpr int nv = D / kLanes;
  const int64_t ld = padded(t_len);
  transpose_padded<D>(h.k, h.stride, t_len, ld, kt);
  for (int64_t i = 0; i < t_len; ++i) {
    const int64_t n = i + 1;
    scores_block<D>(h.q + i * h.stride, kt, ld, n, scale, s);
    float max;
    const float sum = exp_shifted_inplace(s, n, max);
    vf o[nv] = {};
    for (int64_t j = 0; j < n; ++j) {
      const vf p = splat(s[j]);
      const float* vj = h.v + j * h.stride;
      for (int r = 0; r < nv; ++r) o[r] += p * load_u(vj + r * kLanes);
    }
    const vf inv = splat(1.0f / sum);
    float* oi = out + i * h.out_stride;
    for (int r = 0; r < nv; ++r) store_u(oi + r * kLanes, o[r] * inv);
    lse[i] = max + std::log(sum);
  }
}

template <int D>
__attribute__((target_clones("avx512f", "avx2", "default")))
void backward_head_vec(const Head& h, const float* __restrict out, const float* __restrict d_out,
                       const float* __restrict lse, float* __restrict dq, float* __restrict dk, float* __restrict dv,
                       int64_t t_len, float scale, Scratch& w) {
  constexpr int nv = D / kLanes;
  const int64_t ld = padded(t_len);
  float *kt = w.kt.data(), *vt = w.vt.data(), *p = w.p.data(), *dp = w.dp.data();
  float *dk_acc = w.dk.data(), *dv_acc = w.dv.data();
  transpose_padded<D>(h.k, h.stride, t_len, ld, kt);
  transpose_padded<D>(h.v, h.stride, t_len, ld, vt);
  for (int64_t j = 0; j < t_len * D; ++j) dk_acc[j] = dv_acc[j] = 0.0f;
  for (int64_t i = 0; i < t_len; ++i) {
    const int64_t n = i + 1;
    const float* qi = h.q + i * h.stride;
    const float* goi = d_out + i * h.out_stride;
    scores_block<D>(qi, kt, ld, n, scale, p);
    const float l = lse[i];
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) p[j] = exp_nonpositive(p[j] - l);
    scores_block<D>(goi, vt, ld, n, 1.0f, dp);   // dp_ij = dO_i . v_j
    vf q[nv], g[nv], dlt = vf{};
    for (int r = 0; r < nv; ++r) {
      q[r] = load_u(qi + r * kLanes);
      g[r] = load_u(goi + r * kLanes);
      dlt += g[r] * load_u(out + i * h.out_stride + r * kLanes);
    }
    float delta = 0.0f;   // D_i = dO_i . O_i
    for (int e = 0; e < kLanes; ++e) delta += dlt[e];
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) dp[j] = p[j] * (dp[j] - delta) * scale;   // dS_ij, score scale folded in
    vf acc[nv] = {};
    for (int64_t j = 0; j < n; ++j) {
      const vf ds = splat(dp[j]), pj = splat(p[j]);
      const float* kj = h.k + j * h.stride;
      float* dkj = dk_acc + j * D;
      float* dvj = dv_acc + j * D;
      for (int r = 0; r < nv; ++r) {
        acc[r] += ds * load_u(kj + r * kLanes);                                    // dQ_i += dS_ij k_j
        store_u(dkj + r * kLanes, load_u(dkj + r * kLanes) + ds * q[r]);          // dK_j += dS_ij q_i
        store_u(dvj + r * kLanes, load_u(dvj + r * kLanes) + pj * g[r]);          // dV_j += p_ij dO_i
      }
    }
    for (int r = 0; r < nv; ++r) store_u(dq + i * h.stride + r * kLanes, acc[r]);
  }
  for (int64_t j = 0; j < t_len; ++j)
    for (int r = 0; r < nv; ++r) {
      store_u(dk + j * h.stride + r * kLanes, load_u(dk_acc + j * D + r * kLanes));
      store_u(dv + j * h.stride + r * kLanes, load_u(dv_acc + j * D + r * kLanes));
    }
}

Head head_at(const float* qkv, const AttentionDims& a, int64_t b, int64_t hd) {
  const int64_t c = a.heads * a.head_dim;
  const float* q = qkv + b * a.seq * 3 * c + hd * a.head_dim;
  return {q, q + c, q + 2 * c, 3 * c, c};
}

}  // namespace

void causal_attention_forward(const float* qkv, float* out, float* lse, const AttentionDims& a) {
  const int64_t c = a.heads * a.head_dim, tasks = a.batch * a.heads, ld = padded(a.seq);
#pragma omp parallel if (tasks > 1)
  {
    std::vector<float> kt(static_cast<size_t>(ld * a.head_dim)), s(static_cast<size_t>(ld));
#pragma omp for schedule(static)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t b = task / a.heads, hd = task % a.heads;
      const Head h = head_at(qkv, a, b, hd);
      float *o = out + b * a.seq * c + hd * a.head_dim, *l = lse + task * a.seq;
      switch (a.head_dim) {
        case 16: forward_head_vec<16>(h, o, l, a.seq, a.scale, kt.data(), s.data()); break;
        case 32: forward_head_vec<32>(h, o, l, a.seq, a.scale, kt.data(), s.data()); break;
        case 64: forward_head_vec<64>(h, o, l, a.seq, a.scale, kt.data(), s.data()); break;
        case 128: forward_head_vec<128>(h, o, l, a.seq, a.scale, kt.data(), s.data()); break;
        default: forward_head(h, o, l, a.seq, a.head_dim, a.scale, kt.data(), s.data());
      }
    }
  }
}

void causal_attention_backward(const float* qkv, const float* out, const float* lse, const float* d_out, float* d_qkv,
                               const AttentionDims& a) {
  const int64_t c = a.heads * a.head_dim, tasks = a.batch * a.heads, ld = padded(a.seq);
  const size_t td = static_cast<size_t>(ld * a.head_dim), t = static_cast<size_t>(ld);
#pragma omp parallel if (tasks > 1)
  {
    Scratch w{std::vector<float>(td), std::vector<float>(td), std::vector<float>(t), std::vector<float>(t),
              std::vector<float>(td), std::vector<float>(td)};
#pragma omp for schedule(static)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t b = task / a.heads, hd = task % a.heads;
      const int64_t out_off = b * a.seq * c + hd * a.head_dim, in_off = b * a.seq * 3 * c + hd * a.head_dim;
      const Head h = head_at(qkv, a, b, hd);
      const float *o = out + out_off, *g = d_out + out_off, *l = lse + task * a.seq;
      float *dq = d_qkv + in_off, *dk = dq + c, *dv = dq + 2 * c;
      switch (a.head_dim) {
        case 16: backward_head_vec<16>(h, o, g, l, dq, dk, dv, a.seq, a.scale, w); break;
        case 32: backward_head_vec<32>(h, o, g, l, dq, dk, dv, a.seq, a.scale, w); break;
        case 64: backward_head_vec<64>(h, o, g, l, dq, dk, dv, a.seq, a.scale, w); break;
        case 128: backward_head_vec<128>(h, o, g, l, dq, dk, dv, a.seq, a.scale, w); break;
        default: backward_head(h, o, g, l, dq, dk, dv, a.seq, a.head_dim, a.scale, w);
      }
    }
  }
}

}  // namespace colossal::kernels
