// Quantized decoding GEMV with integer dot products, one instruction set's copy: see qgemv.h. The x rows
// arrive quantized to int8 in blocks of 32 inputs (qgemv.cpp: scale = absmax / 127, as llama.cpp's
// Q8_0), so each block of a weight row meets each x row in one integer dot product, summed exactly in
// int32 lanes (AVX2's byte products come in pairs to int16 and then to int32):
//   int8 weights: the weights take x's signs and |x| multiplies them (|x|, |w| <= 127 keep a pair below
//     int16's limit);
//   int4 weights: the stored nibbles n = w + 8 (0..15) multiply x directly, with no unpacking beyond a
//     mask and a shift, and sum(x) * 8 of each block (from the quantizer) is taken off per group.
// Per block each x row then takes one conversion to float and one multiply-add by the block's x scale;
// per group one multiply-add by the weight's scale. Integer sums are exact, so the fixed float order
// after them makes a row's bits independent of the batch and the thread split.
// The avx512vnni copy (this file compiled again with -mavx512vnni: kernels/CMakeLists.txt) forms a
// block's sums with one vpdpbusd (unsigned bytes times signed bytes, four to an int32 lane) instead of
// two multiplies: the same exact sums, so the avx512 copy's bits. With several sequences, where the
// passes are compute-bound, 8 rows took 0.96 (int8) and 0.88 (int4) of the avx512 copy's time.
#include "kernels/cpu/isa_entry.h"
#include "kernels/cpu/simd.h"

namespace colossal::kernels::COLOSSAL_ISA {
namespace {

constexpr int kBlock = 32;   // inputs per x scale and per step
constexpr int64_t kPrefetchBytes = 4096;

#if defined(__AVX2__)
constexpr int kRows = 4;     // x rows per pass over a weight row
// Weight rows per pass for several x rows: 2 where 32 vector registers hold the 2 x 4 tiles' accumulators
// and totals (AVX-512); AVX2's 16 would spill them.
constexpr int kOutputs = kRegs >= 32 ? 2 : 1;
// Weight rows per pass for one sequence of int4. Unpacking and the per-block conversion make that pass
// compute-bound, paced by an output's chain of multiply-adds (one per block, each waiting for the one
// before); passes over several rows run as many chains side by side: 8 take 0.6x the time of one on
// AVX-512, 4 (all AVX2's registers hold) 0.75x. But each row is a stream from memory, and a core
// reads several interleaved streams slower than one: int8 at one sequence streams its weights at memory
// speed, and there 4 streams a pass took 1.3x the time of one; on a Zen 3 (AVX2, about 10 GB/s a core)
// int4 over the 124M shape's 48 block layers ran 1.1-1.2x faster at 2 rows a pass than at 4, though 4 are
// faster where the weights sit in cache. The AVX-512 machines measured had twice the bandwidth a core.
constexpr int kInt4OneRowOutputs = kRegs >= 32 ? 8 : 2;
typedef Vec<8>::type f8;

// The 32 weights of one block as bytes: int8's signed values, or int4's stored nibbles (value + 8).
template <bool Int4>
COLOSSAL_INLINE __m256i block_weights(const uint8_t* q) {
  if constexpr (Int4) {
    // The 16 bytes in both halves (one broadcast load), the upper half shifted down a nibble, then one
    // mask: two vector operations where two masks, a shift and an insert took four (the one-sequence
    // pass is compute-bound).
    const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
    const __m256i halves = _mm256_srlv_epi32(b, _mm256_set_epi32(4, 4, 4, 4, 0, 0, 0, 0));
    return _mm256_and_si256(halves, _mm256_set1_epi8(0x0F));   // inputs 0..15 | 16..31
  } else {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
  }
}

// The block's products as 8 int32 lanes (each the sum of 4 neighbouring ones): x * w for int8 (as |x|
// times w with x's signs, ax = |x|), x * n for int4's nibbles (n <= 15 keeps a pair far below int16's limit).
template <bool Int4>
COLOSSAL_INLINE __m256i block_dot(__m256i w, __m256i x, __m256i ax) {
#if defined(__AVX512VNNI__)
  const __m256i zero = _mm256_setzero_si256();
  return Int4 ? _mm256_dpbusd_epi32(zero, w, x) : _mm256_dpbusd_epi32(zero, ax, _mm256_sign_epi8(w, x));
#else
  const __m256i pairs = Int4 ? _mm256_maddubs_epi16(w, x) : _mm256_maddubs_epi16(ax, _mm256_sign_epi8(w, x));
  return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
#endif
}

// R x rows against O weight rows (outputs o, o + 1, ...; row_bytes apart): each x block is loaded once
// for the O weight rows and each weight block once for the R x rows. Every output's operations are the
// same whatever R and O, so the tiling never changes a bit.
template <int R, int O, bool Int4>
COLOSSAL_INLINE void row(const int8_t* __restrict xq, const uint8_t* __restrict xa, const float* __restrict xs,
                         const float* __restrict xc, int64_t in, const void* __restrict qrow, int64_t row_bytes,
                         const float* __restrict scale, int64_t group, const float* __restrict bias, float* __restrict y,
                         int64_t ldy) {
  constexpr int64_t kBlockBytes = Int4 ? kBlock / 2 : kBlock;
  // Blocks between two requests for each weight row, kPrefetchBytes ahead, the blocks between running
  // without a branch. int4: once a 64-byte line (four blocks), where asking at every block spent load
  // slots the compute-bound one-sequence pass needs. int8: every block (half a line), as before: once a
  // line streamed the 124M shape's block layers at 0.93-0.97 of that rate (Zen 3, 2 threads).
  constexpr int64_t kPrefetchBlocks = Int4 ? 64 / kBlockBytes : 1;
  const int64_t blocks = in / kBlock, groups = in / group;
  // Pointers stepped block by block: indexing by the input (i / 2 of a signed count) cost a handful of
  // scalar instructions a block in a loop of about thirty.
  const uint8_t* w = static_cast<const uint8_t*>(qrow);
  const int8_t* xqb = xq;
  const uint8_t* xab = xa;
  int64_t b = 0;
  f8 total[O][R] = {};
  float offset[O][R] = {};   // int4: the nibbles' +8, scaled, summed over the groups
  f8 acc[O][R];
  float corr[R];
  const auto prefetch = [&]() __attribute__((always_inline)) {
    for (int o = 0; o < O; ++o) __builtin_prefetch(w + o * row_bytes + kPrefetchBytes, 0, 3);
  };
  const auto block = [&]() __attribute__((always_inline)) {
    __m256i wv[O];
    for (int o = 0; o < O; ++o) wv[o] = block_weights<Int4>(w + o * row_bytes);
    for (int r = 0; r < R; ++r) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xqb + r * in));
      const __m256i ax = Int4 ? x : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xab + r * in));
      const f8 xsr = xs[r * blocks + b] - f8{};
      for (int o = 0; o < O; ++o) {
        const f8 d = (f8)_mm256_cvtepi32_ps(block_dot<Int4>(wv[o], x, ax));
        acc[o][r] = fmadd<8>(d, xsr, acc[o][r]);
      }
      if constexpr (Int4) corr[r] += xc[r * blocks + b];
    }
    ++b, w += kBlockBytes, xqb += kBlock, xab += kBlock;
  };
  const bool whole_spans = group % (kPrefetchBlocks * kBlock) == 0;
  for (int64_t gi = 0; gi < groups; ++gi) {
    for (int o = 0; o < O; ++o)
      for (int r = 0; r < R; ++r) acc[o][r] = f8{};
    for (int r = 0; r < R; ++r) corr[r] = 0.0f;
    if (whole_spans) {
      for (int64_t k = 0; k < group; k += kPrefetchBlocks * kBlock) {
        prefetch();
        for (int64_t j = 0; j < kPrefetchBlocks; ++j) block();
      }
    } else {
      for (int64_t k = 0; k < group; k += kBlock) prefetch(), block();
    }
    for (int o = 0; o < O; ++o) {
      const float so = scale[o * groups + gi];
      const f8 s = so - f8{};
      for (int r = 0; r < R; ++r) {
        total[o][r] = fmadd<8>(s, acc[o][r], total[o][r]);
        if constexpr (Int4) offset[o][r] = fmadd(so, corr[r], offset[o][r]);
      }
    }
  }
  for (int o = 0; o < O; ++o)
    for (int r = 0; r < R; ++r) y[r * ldy + o] = (hsum<8>(total[o][r]) - offset[o][r]) + (bias ? bias[o] : 0.0f);
}

#else   // baseline: the same sums, one lane of 4 products at a time (integer sums are exact either way)
constexpr int kRows = 1;
typedef Vec<8>::type f8;

constexpr int kOutputs = 1;
constexpr int kInt4OneRowOutputs = 1;

template <int R, int O, bool Int4>
void row(const int8_t* xq, const uint8_t*, const float* xs, const float* xc, int64_t in, const void* qrow, int64_t, const float* scale,
         int64_t group, const float* bias, float* y, int64_t) {
  static_assert(R == 1 && O == 1);
  f8 total = {};
  float offset = 0;
  for (int64_t g0 = 0, gi = 0; g0 < in; g0 += group, ++gi) {
    f8 acc = {};
    float corr = 0;
    for (int64_t i = g0; i < g0 + group; i += kBlock) {
      int32_t w[kBlock];   // int8's values, or int4's stored nibbles (value + 8)
      for (int k = 0; k < kBlock; ++k) {
        if constexpr (Int4) {
          const uint8_t byte = static_cast<const uint8_t*>(qrow)[i / 2 + (k & 15)];
          w[k] = k < 16 ? byte & 15 : byte >> 4;
        } else {
          w[k] = static_cast<const int8_t*>(qrow)[i + k];
        }
      }
      f8 d;
      for (int lane = 0; lane < 8; ++lane) {
        int32_t s = 0;
        for (int k = 4 * lane; k < 4 * lane + 4; ++k) s += int32_t{xq[i + k]} * w[k];
        d[lane] = static_cast<float>(s);
      }
      acc = fmadd<8>(d, xs[i / kBlock] - f8{}, acc);
      if constexpr (Int4) corr += xc[i / kBlock];
    }
    total = fmadd<8>(scale[gi] - f8{}, acc, total);
    if constexpr (Int4) offset = fmadd(scale[gi], corr, offset);
  }
  y[0] = (hsum<8>(total) - offset) + (bias ? bias[0] : 0.0f);
}
#endif

template <int O, bool Int4>
void rows_q8_outputs(const int8_t* xq, const uint8_t* xa, const float* xs, const float* xc, int64_t rows, int64_t in, const void* q,
                     const float* scales, int64_t group, const float* bias, float* y, int64_t ldy, int64_t o) {
  const int64_t row_bytes = Int4 ? in / 2 : in, groups = in / group, blocks = in / kBlock;
  const void* qo = static_cast<const uint8_t*>(q) + o * row_bytes;
  const float* so = scales + o * groups;
  const float* bo = bias ? bias + o : nullptr;
  for (int64_t r = 0; r < rows; r += kRows) {
    const int8_t* xqr = xq + r * in;
    const uint8_t* xar = xa + r * in;
    const float* xsr = xs + r * blocks;
    const float* xcr = xc + r * blocks;
    float* yr = y + r * ldy + o;
    switch (rows - r < kRows ? rows - r : kRows) {
      case 1: row<1, O, Int4>(xqr, xar, xsr, xcr, in, qo, row_bytes, so, group, bo, yr, ldy); break;
#if defined(__AVX2__)
      case 2: row<2, O, Int4>(xqr, xar, xsr, xcr, in, qo, row_bytes, so, group, bo, yr, ldy); break;
      case 3: row<3, O, Int4>(xqr, xar, xsr, xcr, in, qo, row_bytes, so, group, bo, yr, ldy); break;
      default: row<4, O, Int4>(xqr, xar, xsr, xcr, in, qo, row_bytes, so, group, bo, yr, ldy); break;
#endif
    }
  }
}

template <bool Int4>
void rows_q8(const int8_t* xq, const uint8_t* xa, const float* xs, const float* xc, int64_t rows, int64_t in, const void* q, const float* scales,
             int64_t group, const float* bias, float* y, int64_t ldy, int64_t o_begin, int64_t o_end) {
  int64_t o = o_begin;
  // One sequence of int4: several chains side by side (kInt4OneRowOutputs). Several sequences: two weight
  // rows a pass where the registers hold both tiles. One sequence of int8 is bound by reading the
  // weights, and one row a pass streams them best.
  if constexpr (Int4 && kInt4OneRowOutputs > 1)
    if (rows == 1)
      for (; o + kInt4OneRowOutputs <= o_end; o += kInt4OneRowOutputs)
        rows_q8_outputs<kInt4OneRowOutputs, Int4>(xq, xa, xs, xc, rows, in, q, scales, group, bias, y, ldy, o);
  if (kOutputs > 1 && rows > 1)
    for (; o + kOutputs <= o_end; o += kOutputs) rows_q8_outputs<kOutputs, Int4>(xq, xa, xs, xc, rows, in, q, scales, group, bias, y, ldy, o);
  for (; o < o_end; ++o) rows_q8_outputs<1, Int4>(xq, xa, xs, xc, rows, in, q, scales, group, bias, y, ldy, o);
}

}  // namespace

void qgemv_q8x_int8(const int8_t* xq, const uint8_t* xa, const float* xs, const float* xc, int64_t rows, int64_t in,
                    const int8_t* q, const float* scales, int64_t group, const float* bias, float* y, int64_t ldy, int64_t o_begin,
                    int64_t o_end) {
  rows_q8<false>(xq, xa, xs, xc, rows, in, q, scales, group, bias, y, ldy, o_begin, o_end);
}

void qgemv_q8x_int4(const int8_t* xq, const uint8_t* xa, const float* xs, const float* xc, int64_t rows, int64_t in,
                    const uint8_t* q, const float* scales, int64_t group, const float* bias, float* y, int64_t ldy, int64_t o_begin,
                    int64_t o_end) {
  rows_q8<true>(xq, xa, xs, xc, rows, in, q, scales, group, bias, y, ldy, o_begin, o_end);
}

}  // namespace colossal::kernels::COLOSSAL_ISA

namespace colossal::kernels::COLOSSAL_ISA {
namespace {

#if defined(__AVX2__)
COLOSSAL_INLINE __m256 magnitude(__m256 v) { return _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF))); }

// The largest of v's 8 lanes (max is exact, in any order).
COLOSSAL_INLINE float largest_lane(__m256 v) {
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
}

// 32 int32 values within int8's range as 32 bytes in order: the packs interleave 128-bit halves, the
// permute puts them back.
COLOSSAL_INLINE __m256i to_bytes(const __m256i q[4]) {
  const __m256i w16a = _mm256_packs_epi32(q[0], q[1]), w16b = _mm256_packs_epi32(q[2], q[3]);
  return _mm256_permutevar8x32_epi32(_mm256_packs_epi16(w16a, w16b), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}
#endif

}  // namespace

void quantize_rows_q8(const float* x, int64_t n_blocks, int8_t* xq, uint8_t* xa, float* xs, float* xc, int32_t* xsum) {
  for (int64_t b = 0; b < n_blocks; ++b, x += kBlock, xq += kBlock, xa += kBlock) {
#if defined(__AVX2__)
    // |x|'s largest in vectors (a scalar compare chain cost more than the rest of the block); max is exact.
    __m256 m = magnitude(_mm256_loadu_ps(x));
    for (int v = 1; v < 4; ++v) m = _mm256_max_ps(m, magnitude(_mm256_loadu_ps(x + 8 * v)));
    const float top = largest_lane(m);
#else
    float top = 0.0f;
    for (int k = 0; k < kBlock; ++k) top = top > __builtin_fabsf(x[k]) ? top : __builtin_fabsf(x[k]);
#endif
    xs[b] = top / 127.0f;
    const float inv = top > 0.0f ? 127.0f / top : 0.0f;
#if defined(__AVX2__)
    const __m256 vinv = _mm256_set1_ps(inv);
    __m256i q[4];   // x * 127 / absmax rounded to nearest even (the default rounding mode), in int32
    for (int v = 0; v < 4; ++v) q[v] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * v), vinv));
    const __m256i b8 = to_bytes(q);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(xq), b8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(xa), _mm256_abs_epi8(b8));
#else
    for (int k = 0; k < kBlock; ++k) {
      const int v = static_cast<int>(__builtin_rintf(x[k] * inv));
      xq[k] = static_cast<int8_t>(v);
      xa[k] = static_cast<uint8_t>(v < 0 ? -v : v);
    }
#endif
    // exact; the int4 kernels take 8 * sum * scale off each block (the nibbles' offset)
#if defined(__AVX2__)
    // x + 128 as bytes, summed in four 64-bit lanes by sad against zero, less 32 * 128
    const __m256i sums = _mm256_sad_epu8(_mm256_xor_si256(b8, _mm256_set1_epi8(static_cast<char>(0x80))), _mm256_setzero_si256());
    const __m128i pair = _mm_add_epi64(_mm256_castsi256_si128(sums), _mm256_extracti128_si256(sums, 1));
    const int32_t sum = static_cast<int32_t>(_mm_cvtsi128_si64(_mm_add_epi64(pair, _mm_unpackhi_epi64(pair, pair)))) - kBlock * 128;
#else
    int32_t sum = 0;
    for (int k = 0; k < kBlock; ++k) sum += xq[k];
#endif
    xc[b] = static_cast<float>(8 * sum) * xs[b];
    xsum[b] = sum;
  }
}

// W8A8's rows (isa_kernels.h), with ATen's operations in their order: v = x / divisor; s = max|v| / 127;
// q = clamp(round(v / (s > 0 ? s : 1)), -127, 127), round to nearest even. Divisions, not multiplies by a
// reciprocal: each is one rounding, as ATen's.
void quantize_rows_w8a8(const float* x, const float* divisor, int64_t rows, int64_t in, int8_t* xq, float* xs, int32_t* xsum) {
  for (int64_t m = 0; m < rows; ++m, x += in, xq += in) {
#if defined(__AVX2__)
    auto value = [&](int64_t k) __attribute__((always_inline)) {
      const __m256 v = _mm256_loadu_ps(x + k);
      return divisor ? _mm256_div_ps(v, _mm256_loadu_ps(divisor + k)) : v;
    };
    __m256 top8 = _mm256_setzero_ps();
    for (int64_t k = 0; k < in; k += 8) top8 = _mm256_max_ps(top8, magnitude(value(k)));
    const float top = largest_lane(top8);
#else
    auto value = [&](int64_t k) { return divisor ? x[k] / divisor[k] : x[k]; };
    float top = 0.0f;
    for (int64_t k = 0; k < in; ++k) top = top > __builtin_fabsf(value(k)) ? top : __builtin_fabsf(value(k));
#endif
    const float s = top / 127.0f, d = s > 0.0f ? s : 1.0f;
    int32_t sum = 0;
#if defined(__AVX2__)
    const __m256 vd = _mm256_set1_ps(d);
    const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
    __m256i sums = _mm256_setzero_si256();
    for (int64_t k = 0; k < in; k += kBlock) {
      __m256i q[4];   // rounded to nearest even (the default rounding mode), clamped, in int32
      for (int v = 0; v < 4; ++v) {
        q[v] = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(_mm256_div_ps(value(k + 8 * v), vd)), lo), hi);
        sums = _mm256_add_epi32(sums, q[v]);
      }
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(xq + k), to_bytes(q));
    }
    alignas(32) int32_t lanes[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), sums);
    for (int32_t l : lanes) sum += l;
#else
    for (int64_t k = 0; k < in; ++k) {
      const float r = __builtin_rintf(value(k) / d);
      const int v = static_cast<int>(r < -127.0f ? -127.0f : r > 127.0f ? 127.0f : r);
      xq[k] = static_cast<int8_t>(v);
      sum += v;
    }
#endif
    xs[m] = s;
    xsum[m] = sum;
  }
}

}  // namespace colossal::kernels::COLOSSAL_ISA
