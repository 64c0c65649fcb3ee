// Decoding attention, one instruction set's copy of the per-head loop: see decode_attention.h. The
// scores take eight keys per pass over q, their horizontal sums done together; the weighted sum of
// values keeps its output columns in registers, at most 8 vectors at a time, across all positions.
#include <cmath>
#include <type_traits>

#include "kernels/cpu/isa_entry.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/vec_math.h"

namespace colossal::kernels::COLOSSAL_ISA {
namespace {

// One key's products q * k summed into a vector, chunk by chunk in order (d a multiple of kLanes).
COLOSSAL_INLINE vf key_lanes(const float* __restrict q, const float* __restrict k, int64_t d) {
  vf a{};
  for (int64_t c = 0; c < d; c += kLanes) a += load_u(q + c) * load_u(k + c);
  return a;
}

#if defined(__AVX2__)
// Eight keys' lane vectors summed at once into one vector of eight sums, each by hsum's tree (halves
// added, then their halves...), so a key's score has the same bits here as alone in the tail below and
// does not depend on where a block or a group of eight starts. Eight separate horizontal sums cost
// about four times the shuffles and adds (the scores were 15% of an 8-sequence int8 decoding step).
COLOSSAL_INLINE __m256 sum_eight(const vf (&a)[8]) {
  __m256 b[8];
  for (int i = 0; i < 8; ++i) {
#if defined(__AVX512F__)
    const __m512 z = (__m512)a[i];
    b[i] = _mm256_add_ps(_mm512_extractf32x8_ps(z, 0), _mm512_extractf32x8_ps(z, 1));   // lanes e + (e + 8)
#else
    b[i] = (__m256)a[i];
#endif
  }
  __m256 c[4];   // keys i and i + 4: each key's 128-bit halves added, e + (e + 4)
  for (int i = 0; i < 4; ++i)
    c[i] = _mm256_add_ps(_mm256_permute2f128_ps(b[i], b[i + 4], 0x20), _mm256_permute2f128_ps(b[i], b[i + 4], 0x31));
  // e + (e + 2) within each key's four lanes: keys 0 1 | 4 5 and 2 3 | 6 7
  const __m256 d0 = _mm256_add_ps(_mm256_shuffle_ps(c[0], c[1], 0x44), _mm256_shuffle_ps(c[0], c[1], 0xEE));
  const __m256 d1 = _mm256_add_ps(_mm256_shuffle_ps(c[2], c[3], 0x44), _mm256_shuffle_ps(c[2], c[3], 0xEE));
  // e + (e + 1): keys 0 1 2 3 | 4 5 6 7
  return _mm256_add_ps(_mm256_shuffle_ps(d0, d1, 0x88), _mm256_shuffle_ps(d0, d1, 0xDD));
}
#endif

// s[j] = scale * q . k_j for j < n, keys d apart.
void scores(const float* __restrict q, const float* __restrict k, int64_t n, int64_t d, float scale, float* __restrict s) {
  int64_t j = 0;
  if (d % kLanes == 0) {
#if defined(__AVX2__)
    const __m256 vscale = _mm256_set1_ps(scale);
    for (; j + 8 <= n; j += 8) {
      vf a[8];
      for (int i = 0; i < 8; ++i) a[i] = key_lanes(q, k + (j + i) * d, d);
      _mm256_storeu_ps(s + j, _mm256_mul_ps(sum_eight(a), vscale));
    }
#endif
    for (; j < n; ++j) s[j] = hsum(key_lanes(q, k + j * d, d)) * scale;
    return;
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

// ALiBi's distance bias slope * (j - (n - 1)) added to the scores of a query at position n - 1 (none at
// slope 0), the same expression over a cache and over blocks, so both give a key the same bits.
COLOSSAL_INLINE void add_alibi(float slope, int64_t n, float* __restrict s) {
  if (slope != 0.0f)
    for (int64_t j = 0; j < n; ++j) s[j] += slope * static_cast<float>(j - (n - 1));
}

}  // namespace

void attention_decode_head(const float* __restrict q, const float* __restrict k, const float* __restrict v, int64_t n,
                           int64_t d, float scale, float slope, const uint8_t* valid, float* __restrict s,
                           float* __restrict out) {
  scores(q, k, n, d, scale, s);
  add_alibi(slope, n, s);
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
  add_alibi(slope, n, s);
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
