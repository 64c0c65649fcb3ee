// Decoding attention, one instruction set's copy of the per-head loop: see decode_attention.h. The
// scores take four keys per pass over q (one horizontal sum each at the end); the weighted sum of
// values keeps its output columns in registers, at most 8 vectors at a time, across all positions.
#include <cmath>
#include <type_traits>

#include "kernels/cpu/isa_entry.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/vec_math.h"

namespace colossal::kernels::COLOSSAL_ISA {
namespace {

// s[j] = scale * q . k_j for j < n, keys d apart.
void scores(const float* __restrict q, const float* __restrict k, int64_t n, int64_t d, float scale, float* __restrict s) {
  int64_t j = 0;
  if (d % kLanes == 0) {
    for (; j + 4 <= n; j += 4) {
      const float* k0 = k + j * d;
      vf a0{}, a1{}, a2{}, a3{};
      for (int64_t c = 0; c < d; c += kLanes) {
        const vf qv = load_u(q + c);
        a0 += qv * load_u(k0 + c);
        a1 += qv * load_u(k0 + d + c);
        a2 += qv * load_u(k0 + 2 * d + c);
        a3 += qv * load_u(k0 + 3 * d + c);
      }
      s[j] = hsum(a0) * scale;
      s[j + 1] = hsum(a1) * scale;
      s[j + 2] = hsum(a2) * scale;
      s[j + 3] = hsum(a3) * scale;
    }
  }
  for (; j < n; ++j) {
    float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
    for (int64_t c = 0; c < d; ++c) acc += q[c] * k[j * d + c];
    s[j] = acc * scale;
  }
}

// out[0, NV * kLanes) = inv * sum_j p[j] v_j[0, NV * kLanes), rows of v d apart.
template <int NV>
void weighted_values(const float* __restrict p, const float* __restrict v, int64_t n, int64_t d, float inv,
                     float* __restrict out) {
  vf acc[NV] = {};
  for (int64_t j = 0; j < n; ++j) {
    const vf pj = splat(p[j]);
    for (int i = 0; i < NV; ++i) acc[i] += pj * load_u(v + j * d + i * kLanes);
  }
  for (int i = 0; i < NV; ++i) store_u(out + i * kLanes, acc[i] * inv);
}

}  // namespace

void attention_decode_head(const float* __restrict q, const float* __restrict k, const float* __restrict v, int64_t n,
                           int64_t d, float scale, const uint8_t* valid, float* __restrict s, float* __restrict out) {
  scores(q, k, n, d, scale, s);
  bool any = !valid;
  if (valid) {
    for (int64_t j = 0; j < n; ++j) {
      if (!valid[j]) s[j] = -INFINITY;
      any = any || valid[j];
    }
  }
  if (!any) {   // nothing to attend to
    for (int64_t c = 0; c < d; ++c) out[c] = 0.0f;
    return;
  }
  // Decided by the count above, not by max == -inf: OpenMP starts a float max reduction's private
  // copies at the lowest finite value, so over all -inf scores clang's loop gives -FLT_MAX (GCC's -inf),
  // and the weights then came out 0 / 0.
  float max = -INFINITY;
#pragma omp simd reduction(max : max)
  for (int64_t j = 0; j < n; ++j) max = s[j] > max ? s[j] : max;
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < n; ++j) {
    s[j] = s[j] == -INFINITY ? 0.0f : exp_nonpositive(s[j] - max);
    sum += s[j];
  }
  const float inv = 1.0f / sum;
  int64_t c = 0;
  for (; c + 8 * kLanes <= d; c += 8 * kLanes) weighted_values<8>(s, v + c, n, d, inv, out + c);
  if (c + 4 * kLanes <= d) weighted_values<4>(s, v + c, n, d, inv, out + c), c += 4 * kLanes;
  if (c + 2 * kLanes <= d) weighted_values<2>(s, v + c, n, d, inv, out + c), c += 2 * kLanes;
  if (c + kLanes <= d) weighted_values<1>(s, v + c, n, d, inv, out + c), c += kLanes;
  for (; c < d; ++c) {
    float acc = 0.0f;
    for (int64_t j = 0; j < n; ++j) acc += s[j] * v[j * d + c];
    out[c] = acc * inv;
  }
}

// The same over keys and values in blocks (paged_attention.h): the scores block by block into s, ALiBi's
// slope * (j - (n - 1)) added when slope is non-zero, the softmax over all n, the weighted values block by
// block with the output columns in registers across every block.
void attention_paged_head(const float* __restrict q, const float* __restrict k_base, const float* __restrict v_base,
                          const int32_t* __restrict table, int64_t n, int64_t block_size, int64_t block_stride, int64_t d,
                          float scale, float slope, float* __restrict s, float* __restrict out) {
  for (int64_t b = 0, j0 = 0; j0 < n; ++b, j0 += block_size)
    scores(q, k_base + table[b] * block_stride, n - j0 < block_size ? n - j0 : block_size, d, scale, s + j0);
  if (slope != 0.0f)
    for (int64_t j = 0; j < n; ++j) s[j] += slope * static_cast<float>(j - (n - 1));
  float max;
  const float inv = 1.0f / exp_shifted_inplace(s, n, max);
  int64_t c = 0;
  auto columns = [&](auto nv) {
    constexpr int NV = decltype(nv)::value;
    vf acc[NV] = {};
    for (int64_t b = 0, j0 = 0; j0 < n; ++b, j0 += block_size) {
      const float* v = v_base + table[b] * block_stride + c;
      const int64_t m = n - j0 < block_size ? n - j0 : block_size;
      for (int64_t j = 0; j < m; ++j) {
        const vf pj = splat(s[j0 + j]);
        for (int i = 0; i < NV; ++i) acc[i] += pj * load_u(v + j * d + i * kLanes);
      }
    }
    for (int i = 0; i < NV; ++i) store_u(out + c + i * kLanes, acc[i] * inv);
    c += NV * kLanes;
  };
  for (; c + 8 * kLanes <= d;) columns(std::integral_constant<int, 8>{});
  if (c + 4 * kLanes <= d) columns(std::integral_constant<int, 4>{});
  if (c + 2 * kLanes <= d) columns(std::integral_constant<int, 2>{});
  if (c + kLanes <= d) columns(std::integral_constant<int, 1>{});
  for (; c < d; ++c) {
    float acc = 0.0f;
    for (int64_t b = 0, j0 = 0; j0 < n; ++b, j0 += block_size) {
      const float* v = v_base + table[b] * block_stride + c;
      const int64_t m = n - j0 < block_size ? n - j0 : block_size;
      for (int64_t j = 0; j < m; ++j) acc += s[j0 + j] * v[j * d];
    }
    out[c] = acc * inv;
  }
}

}  // namespace colossal::kernels::COLOSSAL_ISA
