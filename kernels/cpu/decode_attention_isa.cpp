// Decoding attention, one instruction set's copy of the per-head loop: see decode_attention.h. The
// scores take eight keys per pass over q, their horizontal sums done together; the weighted sum of
// values keeps its output columns in registers, at most 8 vectors at a time, across all positions.
// Every loop is written once over the cache's element (kv_element.h): 16-bit keys and values are
// widened as they are loaded, int8 ones widened and multiplied by their row's scale (one rounding), so
// over any of them a head gives the bits it gives over their fp32 copy (the values as read back).
#include <cmath>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/half_widen.h"
#include "kernels/cpu/isa_entry.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/vec_math.h"

namespace colossal::kernels::COLOSSAL_ISA {
namespace {

template <KvElement E>
using Stored = KvStored<E>;

// The scale of an int8 row of d values starting at `row` (1 for the other kinds, which have none).
template <KvElement E>
COLOSSAL_INLINE float row_scale(const Stored<E>* row, int64_t d) {
  if constexpr (E == KvElement::int8) {
    float scale;
    std::memcpy(&scale, row + d, sizeof scale);
    return scale;
  } else {
    return 1.0f;
  }
}

// One stored element as the float it stands for: 16-bit kinds widened exactly, int8 times its row's
// scale `rs` (ignored by the other kinds).
template <KvElement E>
COLOSSAL_INLINE float load_kv1(const Stored<E>* p, float rs) {
  if constexpr (E == KvElement::f32) return *p;
  else if constexpr (E == KvElement::fp16) return half_to_float(*p);
  else if constexpr (E == KvElement::bf16) return bf16_to_float(*p);
  else return static_cast<float>(*p) * rs;
}

// kLanes stored elements as a float vector: bf16 is the top half of a float (a zero-extension and a
// shift, in vector extensions for every set); fp16 takes F16C's conversion; int8 is sign-extended,
// converted (both exact) and multiplied by its row's scale `rs`, the same single rounding as load_kv1.
template <KvElement E>
COLOSSAL_INLINE vf load_kv(const Stored<E>* p, vf rs) {
  if constexpr (E == KvElement::f32) {
    return load_u(p);
  } else if constexpr (E == KvElement::int8) {
    // Spelled per set: GCC 12 converts a byte vector to floats element by element.
#if defined(__AVX512F__)
    return (vf)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))) * rs;
#elif defined(__AVX2__)
    return (vf)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)))) * rs;
#else
    float t[kLanes];
    for (int e = 0; e < kLanes; ++e) t[e] = static_cast<float>(p[e]);
    return load_u(t) * rs;
#endif
  } else if constexpr (E == KvElement::bf16) {
    typedef uint16_t narrow __attribute__((vector_size(kLanes * 2), aligned(2)));
    typedef uint32_t wide __attribute__((vector_size(kLanes * 4)));
    return (vf)(__builtin_convertvector(*reinterpret_cast<const narrow*>(p), wide) << 16);
  } else {
#if defined(__AVX512F__)
    // The zero-masked form under a full mask: the same instruction, where GCC 12's unmasked one starts
    // from an undefined register it then warns about.
    return (vf)_mm512_maskz_cvtph_ps(0xffff, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
#elif defined(__AVX2__)
    return (vf)_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#else
    float t[kLanes];
    for (int e = 0; e < kLanes; ++e) t[e] = load_kv1<E>(p + e, 1.0f);
    return load_u(t);
#endif
  }
}

// Positions ahead the attention loops prefetch their keys and values: a head's cache is a short stream
// (a few hundred lines), where the hardware's prefetcher has barely started; with it, 8 sequences of
// int8 weights over an fp16 cache at 512 new tokens decoded 1.16x faster on the Xeon (fp32 cache: level).
constexpr int64_t kAhead = 16;

// The same for kind E: at least the bytes 16 fp16 rows of 64 span (2 KiB), so that int8's shorter rows
// keep as many lines in flight (at 16 rows their steps read the cache at half fp16's rate per line).
// `stride`: stored elements from one row to the next.
template <KvElement E>
constexpr int64_t ahead_rows(int64_t stride) {
  const int64_t row = stride * static_cast<int64_t>(sizeof(Stored<E>)), rows = 2048 / (row > 0 ? row : 1);
  return rows > kAhead ? rows : kAhead;
}

// Every cache line overlapping [p, p + bytes): int8 rows (d + 4 bytes) start anywhere within a line.
COLOSSAL_INLINE void prefetch_span(const void* p, int64_t bytes) {
  const uintptr_t first = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{63}, end = reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(bytes);
  for (uintptr_t line = first; line < end; line += 64) __builtin_prefetch(reinterpret_cast<const void*>(line), 0, 3);
}

// One key's products q * k summed into a vector, chunk by chunk in order (d a multiple of kLanes).
template <KvElement E>
COLOSSAL_INLINE vf key_lanes(const float* __restrict q, const Stored<E>* __restrict k, int64_t d) {
  const vf rs = splat(row_scale<E>(k, d));
  vf a{};
  for (int64_t c = 0; c < d; c += kLanes) a += load_u(q + c) * load_kv<E>(k + c, rs);
  return a;
}

// The scalar paths of head sizes off the vector width, in one out-of-line copy every element kind calls
// with fp32 values (16-bit ones widened into a buffer first), so a 16-bit cache gives its fp32 copy's bits:
// inlined into each kind's loop, the compiler vectorised the same sums differently per kind. The
// multiply-add is spelled out: left to contraction, a loop vectorised in order multiplies in vectors and
// adds one by one, unfused, where its scalar twin fuses. acc + sum_i a[i] * b[i * b_stride], in order.
__attribute__((noinline)) float dot_in_order(const float* __restrict a, const float* __restrict b, int64_t b_stride, int64_t m,
                                             float acc) {
  for (int64_t i = 0; i < m; ++i) acc = fmadd(a[i], b[i * b_stride], acc);
  return acc;
}

constexpr int64_t kWidenChunk = 64;   // elements widened at a time for dot_in_order

// acc + sum_i a[i] * float(b[i * b_stride]) for i < m, through dot_in_order; scale_of(i) is element i's
// row scale (int8 only).
template <KvElement E, class Scale>
COLOSSAL_INLINE float dot_stored(const float* __restrict a, const Stored<E>* __restrict b, int64_t b_stride, int64_t m, float acc,
                                 const Scale& scale_of) {
  if constexpr (E == KvElement::f32) {
    return dot_in_order(a, b, b_stride, m, acc);
  } else {
    float wide[kWidenChunk];
    for (int64_t i0 = 0; i0 < m; i0 += kWidenChunk) {
      const int64_t len = m - i0 < kWidenChunk ? m - i0 : kWidenChunk;
      for (int64_t i = 0; i < len; ++i) wide[i] = load_kv1<E>(b + (i0 + i) * b_stride, scale_of(i0 + i));
      acc = dot_in_order(a + i0, wide, 1, len, acc);
    }
    return acc;
  }
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

// s[j] = scale * q . k_j for j < n, keys kv_row_elements(E, d) apart.
template <KvElement E>
void scores(const float* __restrict q, const Stored<E>* __restrict k, int64_t n, int64_t d, float scale, float* __restrict s) {
  const int64_t stride = kv_row_elements(E, d);
  [[maybe_unused]] const int64_t ahead = ahead_rows<E>(stride);   // (the baseline copy does not prefetch)
  int64_t j = 0;
  if (d % kLanes == 0) {
#if defined(__AVX2__)
    const __m256 vscale = _mm256_set1_ps(scale);
    for (; j + 8 <= n; j += 8) {
      // the keys `ahead` positions on (within these n: a block's own)
      if (j + ahead + 8 <= n) prefetch_span(k + (j + ahead) * stride, 8 * stride * static_cast<int64_t>(sizeof(Stored<E>)));
      vf a[8];
      for (int i = 0; i < 8; ++i) a[i] = key_lanes<E>(q, k + (j + i) * stride, d);
      _mm256_storeu_ps(s + j, _mm256_mul_ps(sum_eight(a), vscale));
    }
#endif
    for (; j < n; ++j) s[j] = hsum(key_lanes<E>(q, k + j * stride, d)) * scale;
    return;
  }
  for (; j < n; ++j) {   // a head size off the vector width
    const float ks = row_scale<E>(k + j * stride, d);
    s[j] = dot_stored<E>(q, k + j * stride, 1, d, 0.0f, [ks](int64_t) { return ks; }) * scale;
  }
}

// out[0, NV * kLanes) = inv * sum_j p[j] v_j[0, NV * kLanes), rows of v `stride` apart, row j's scale
// (int8) `scale_at` elements past v + j * stride.
template <int NV, KvElement E>
void weighted_values(const float* __restrict p, const Stored<E>* __restrict v, int64_t n, int64_t stride, int64_t scale_at,
                     float inv, float* __restrict out) {
  const int64_t ahead = ahead_rows<E>(stride);
  vf acc[NV] = {};
  for (int64_t j = 0; j < n; ++j) {
    if (j + ahead < n) {   // these columns `ahead` positions on, and an int8 row's scale after them
      const Stored<E>* next = v + (j + ahead) * stride;
      prefetch_span(next, NV * kLanes * static_cast<int64_t>(sizeof(Stored<E>)));
      if constexpr (E == KvElement::int8) __builtin_prefetch(next + scale_at, 0, 3);
    }
    const vf pj = splat(p[j]);
    const vf rs = splat(row_scale<E>(v + j * stride, scale_at));
    for (int i = 0; i < NV; ++i) acc[i] += pj * load_kv<E>(v + j * stride + i * kLanes, rs);
  }
  for (int i = 0; i < NV; ++i) store_u(out + i * kLanes, acc[i] * inv);
}

// ALiBi's distance bias slope * (j - (n - 1)) added to the scores of a query at position n - 1 (none at
// slope 0), the same expression over a cache and over blocks, so both give a key the same bits.
COLOSSAL_INLINE void add_alibi(float slope, int64_t n, float* __restrict s) {
  if (slope != 0.0f)
    for (int64_t j = 0; j < n; ++j) s[j] += slope * static_cast<float>(j - (n - 1));
}

template <KvElement E>
void decode_head(const float* __restrict q, const Stored<E>* __restrict k, const Stored<E>* __restrict v, int64_t n,
                 int64_t d, float scale, float slope, const uint8_t* valid, float* __restrict s, float* __restrict out) {
  scores<E>(q, k, n, d, scale, s);
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
  const int64_t stride = kv_row_elements(E, d);
  int64_t c = 0;
  for (; c + 8 * kLanes <= d; c += 8 * kLanes) weighted_values<8, E>(s, v + c, n, stride, d - c, inv, out + c);
  if (c + 4 * kLanes <= d) weighted_values<4, E>(s, v + c, n, stride, d - c, inv, out + c), c += 4 * kLanes;
  if (c + 2 * kLanes <= d) weighted_values<2, E>(s, v + c, n, stride, d - c, inv, out + c), c += 2 * kLanes;
  if (c + kLanes <= d) weighted_values<1, E>(s, v + c, n, stride, d - c, inv, out + c), c += kLanes;
  for (; c < d; ++c)
    out[c] = dot_stored<E>(s, v + c, stride, n, 0.0f, [&](int64_t j) { return row_scale<E>(v + j * stride, d); }) * inv;
}

// The same over keys and values in blocks (paged_attention.h; block_stride in stored elements, rows
// kv_row_elements(E, d) apart within a block): the scores block by block into s, ALiBi's
// slope * (j - (n - 1)) added when slope is non-zero, the softmax over all n, the weighted values block by
// block with the output columns in registers across every block.
template <KvElement E>
void paged_head(const float* __restrict q, const Stored<E>* __restrict k_base, const Stored<E>* __restrict v_base,
                const int32_t* __restrict table, int64_t n, int64_t block_size, int64_t block_stride, int64_t d, float scale,
                float slope, float* __restrict s, float* __restrict out) {
  for (int64_t b = 0, j0 = 0; j0 < n; ++b, j0 += block_size)
    scores<E>(q, k_base + table[b] * block_stride, n - j0 < block_size ? n - j0 : block_size, d, scale, s + j0);
  add_alibi(slope, n, s);
  float max;
  const float inv = 1.0f / exp_shifted_inplace(s, n, max);
  const int64_t stride = kv_row_elements(E, d);
  int64_t c = 0;
  auto columns = [&](auto nv) {
    constexpr int NV = decltype(nv)::value;
    vf acc[NV] = {};
    for (int64_t b = 0, j0 = 0; j0 < n; ++b, j0 += block_size) {
      const Stored<E>* v = v_base + table[b] * block_stride + c;
      const int64_t m = n - j0 < block_size ? n - j0 : block_size;
      for (int64_t j = 0; j < m; ++j) {
        const vf pj = splat(s[j0 + j]);
        const vf rs = splat(row_scale<E>(v + j * stride, d - c));
        for (int i = 0; i < NV; ++i) acc[i] += pj * load_kv<E>(v + j * stride + i * kLanes, rs);
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
      const Stored<E>* v = v_base + table[b] * block_stride;
      acc = dot_stored<E>(s + j0, v + c, stride, n - j0 < block_size ? n - j0 : block_size, acc,
                          [&](int64_t j) { return row_scale<E>(v + j * stride, d); });
    }
    out[c] = acc * inv;
  }
}

}  // namespace

// f(kind) with the element kind as a compile-time constant (std::integral_constant<KvElement, E>).
template <class F>
COLOSSAL_INLINE void with_element(KvElement e, const F& f) {
  switch (e) {
    case KvElement::f32: return f(std::integral_constant<KvElement, KvElement::f32>{});
    case KvElement::fp16: return f(std::integral_constant<KvElement, KvElement::fp16>{});
    case KvElement::bf16: return f(std::integral_constant<KvElement, KvElement::bf16>{});
    case KvElement::int8: return f(std::integral_constant<KvElement, KvElement::int8>{});
  }
}

void attention_decode_head(const float* q, const void* k, const void* v, KvElement e, int64_t n, int64_t d, float scale,
                           float slope, const uint8_t* valid, float* s, float* out) {
  with_element(e, [&](auto kind) {
    constexpr KvElement E = decltype(kind)::value;
    decode_head<E>(q, static_cast<const Stored<E>*>(k), static_cast<const Stored<E>*>(v), n, d, scale, slope, valid, s, out);
  });
}

void attention_paged_head(const float* q, const void* k_base, const void* v_base, KvElement e, const int32_t* table, int64_t n,
                          int64_t block_size, int64_t block_stride, int64_t d, float scale, float slope, float* s, float* out) {
  with_element(e, [&](auto kind) {
    constexpr KvElement E = decltype(kind)::value;
    paged_head<E>(q, static_cast<const Stored<E>*>(k_base), static_cast<const Stored<E>*>(v_base), table, n, block_size, block_stride,
                  d, scale, slope, s, out);
  });
}

namespace {

// One int8 row (kv_element.h's rule): n values, then the scale's bytes.
void store_int8_row(const float* __restrict src, int8_t* __restrict dst, int64_t n) {
  float amax = 0.0f;
#pragma omp simd reduction(max : amax)
  for (int64_t i = 0; i < n; ++i) amax = std::fabs(src[i]) > amax ? std::fabs(src[i]) : amax;
  const float inv = amax >= kKvInt8Smallest ? kKvInt8Max / amax : 0.0f;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float r = std::nearbyint(src[i] * inv);   // nearest-even, as ATen's round
    dst[i] = static_cast<int8_t>(r < -kKvInt8Max ? -kKvInt8Max : r > kKvInt8Max ? kKvInt8Max : r);
  }
  const float scale = amax / kKvInt8Max;
  std::memcpy(dst + n, &scale, sizeof scale);
}

}  // namespace

void store_kv(const float* src, void* dst, int64_t n, KvElement e) {
  switch (e) {
    case KvElement::f32: std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float)); return;
    case KvElement::fp16: narrow_fp16(src, static_cast<uint16_t*>(dst), n); return;
    case KvElement::bf16: narrow_bf16(src, static_cast<uint16_t*>(dst), n); return;
    case KvElement::int8: store_int8_row(src, static_cast<int8_t*>(dst), n); return;
  }
}

}  // namespace colossal::kernels::COLOSSAL_ISA
