// Quantized GEMM for kernel sets without VNNI (avx2, and avx512 on CPUs without its VNNI): the same
// panels (qgemm.h) and the same bits as the VNNI copy, with AVX2's byte multiply instead of vpdpbusd.
//
// vpmaddubsw multiplies unsigned bytes by signed ones and adds neighbouring pairs into int16, saturating.
// The panel's byte u = w + 128 (up to 255) times x (up to 127 in size) would overflow a pair, so the
// product is split so that every pair stays small enough for a whole block (8 panel rows of 4 inputs)
// to sum in int16 lanes without saturating:
//   int8: the caller splits x once a product (qgemm_split_rows, QgemmProblem::split) into x = 16 a + b
//     with a in [-8, 8] and b in [-8, 7]; u * a and u * b pairs are at most 2 x 255 x 8 = 4080, a
//     block's 8 of them 32640. The panel bytes multiply as they are.
//   int4: the panel's nibbles (0..15) multiply x: pairs of at most 2 x 15 x 127 = 3810, a block's 8
//     of them (4 rows, two nibbles each) 30480.
// Once a block, vpmaddwd takes each column's int16 pairs to int32 (u * a times 16), and then the VNNI
// copy's epilogue follows, operation for operation: minus 128 (int4: 8) x the block's x sum, to float,
// times the x scale, summed over the group, times the weights' scale, plus the bias.
//
// Per x row, 4 inputs and 8 columns: two byte multiplies and two int16 adds, where the row-layout GEMV
// (qdot_isa.cpp) spends a sign, a byte multiply and a pair add on 4 inputs of one column and then a
// conversion and a multiply-add per column and block; here those are once per 8 columns.
//
// The avx512 copy does the same in 512-bit vectors (AVX-512BW has the byte multiply at that width): a
// tile's 16 columns in one vector where AVX2 takes two halves, and with 32 registers twice the x rows a
// group. Every lane's operations are the 256-bit copy's, so the bits are too.
#include "kernels/cpu/isa_entry.h"
#include "kernels/cpu/qgemm.h"
#include "kernels/cpu/qgemm_tiles.h"
#include "kernels/cpu/simd.h"

#if defined(__AVX2__)
#include <immintrin.h>

// GCC 12's 512-bit conversion and masked intrinsics start from _mm512_undefined_*, which -O3 reports as
// (maybe) uninitialized wherever they inline (as in qgemm_isa.cpp).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace colossal::kernels::COLOSSAL_ISA {
namespace {

constexpr int kBlock = 32;           // inputs per x scale
constexpr int64_t kPrefetchBytes = 4096;   // as the VNNI copy: packed panels stream from memory

// The integer vectors a copy works in: a tile's 16 columns of 4 bytes in one 512-bit vector (avx512), or
// in two 256-bit halves (avx2). "Half" below is what one vector holds: half a tile, or all of it.
#if defined(__AVX512BW__)
constexpr int kHalf = 16;            // columns a vector holds (4 inputs each)
constexpr int kHalfBytes = 64;       // a panel row's part in one vector
typedef __m512i VI;
COLOSSAL_INLINE VI load_i(const uint8_t* at) { return _mm512_loadu_si512(at); }
COLOSSAL_INLINE VI zero_i() { return _mm512_setzero_si512(); }
COLOSSAL_INLINE VI set1_32(int32_t v) { return _mm512_set1_epi32(v); }
COLOSSAL_INLINE VI set1_16(int16_t v) { return _mm512_set1_epi16(v); }
COLOSSAL_INLINE VI set1_8(char v) { return _mm512_set1_epi8(v); }
COLOSSAL_INLINE VI and_i(VI a, VI b) { return _mm512_and_si512(a, b); }
COLOSSAL_INLINE VI srli16(VI a, int n) { return _mm512_srli_epi16(a, n); }
COLOSSAL_INLINE VI maddubs(VI u, VI x) { return _mm512_maddubs_epi16(u, x); }
COLOSSAL_INLINE VI madd16(VI a, VI b) { return _mm512_madd_epi16(a, b); }
COLOSSAL_INLINE VI add32(VI a, VI b) { return _mm512_add_epi32(a, b); }
COLOSSAL_INLINE VI sub32(VI a, VI b) { return _mm512_sub_epi32(a, b); }
COLOSSAL_INLINE vf to_float(VI a) { return (vf)_mm512_cvtepi32_ps(a); }
// y's `valid` columns from `at` (masked lanes are neither read nor written, so never past the row)
COLOSSAL_INLINE __mmask16 columns(int64_t valid) { return valid >= kHalf ? __mmask16(0xFFFF) : __mmask16((1u << valid) - 1); }
COLOSSAL_INLINE void store_columns(float* at, vf v, int64_t valid) { _mm512_mask_storeu_ps(at, columns(valid), (__m512)v); }
COLOSSAL_INLINE vf load_columns(const float* at, int64_t valid) { return (vf)_mm512_maskz_loadu_ps(columns(valid), at); }
// acc += p in int16 lanes, in place (see the AVX2 one below); "v": any of the 32 registers
COLOSSAL_INLINE void add16(VI& acc, VI p) { asm("vpaddw %1, %0, %0" : "+v"(acc) : "v"(p)); }
#else
constexpr int kHalf = 8;             // columns a 256-bit vector holds (4 inputs each): half a tile
constexpr int kHalfBytes = 32;       // a panel row's half
typedef __m256i VI;
COLOSSAL_INLINE VI load_i(const uint8_t* at) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at)); }
COLOSSAL_INLINE VI zero_i() { return _mm256_setzero_si256(); }
COLOSSAL_INLINE VI set1_32(int32_t v) { return _mm256_set1_epi32(v); }
COLOSSAL_INLINE VI set1_16(int16_t v) { return _mm256_set1_epi16(v); }
COLOSSAL_INLINE VI set1_8(char v) { return _mm256_set1_epi8(v); }
COLOSSAL_INLINE VI and_i(VI a, VI b) { return _mm256_and_si256(a, b); }
COLOSSAL_INLINE VI srli16(VI a, int n) { return _mm256_srli_epi16(a, n); }
COLOSSAL_INLINE VI maddubs(VI u, VI x) { return _mm256_maddubs_epi16(u, x); }
COLOSSAL_INLINE VI madd16(VI a, VI b) { return _mm256_madd_epi16(a, b); }
COLOSSAL_INLINE VI add32(VI a, VI b) { return _mm256_add_epi32(a, b); }
COLOSSAL_INLINE VI sub32(VI a, VI b) { return _mm256_sub_epi32(a, b); }
COLOSSAL_INLINE vf to_float(VI a) { return (vf)_mm256_cvtepi32_ps(a); }
// y's `valid` (<= 8) columns from `at`: whole vectors where the half is whole.
COLOSSAL_INLINE void store_columns(float* at, vf v, int64_t valid) {
  if (valid >= kHalf) {
    store_u(at, v);
    return;
  }
  float lanes[kHalf];
  store_u(lanes, v);
  for (int64_t c = 0; c < valid; ++c) at[c] = lanes[c];
}
COLOSSAL_INLINE vf load_columns(const float* at, int64_t valid) {
  if (valid >= kHalf) return load_u(at);
  float lanes[kHalf] = {};
  for (int64_t c = 0; c < valid; ++c) lanes[c] = at[c];
  return load_u(lanes);
}
// acc += p in int16 lanes, in place: GCC otherwise adds into p's register and copies the sum back to
// acc's, a move per accumulator per step, and spills one of the int8 loop's eight.
COLOSSAL_INLINE void add16(VI& acc, VI p) { asm("vpaddw %1, %0, %0" : "+x"(acc) : "x"(p)); }
#endif
constexpr int kTileVectors = kQgemmColumns / kHalf;   // vectors a whole tile takes: 2 (avx2) or 1
// The float side (scales, sums, outputs) in simd.h's vectors, whose lanes are the integer vectors'.
static_assert(kLanes == kHalf, "one float vector per integer vector");

COLOSSAL_INLINE VI broadcast4(const int8_t* at) {
  int32_t four;
  __builtin_memcpy(&four, at, 4);
  return set1_32(four);
}

// The tile's weights as panel rows (qgemm.h: int8 + 128, or int4's stored bytes) and its scales
// [group][16]. Columns past `valid` are zero weights (the offset itself) with zero scales.
void pack_tile(const QgemmProblem& p, int64_t n0, int64_t valid, uint8_t* panel, float* scales) {
  const int64_t in = p.in, groups = in / p.group, row_bytes = p.int4 ? in / 2 : in;
  const uint8_t* base = static_cast<const uint8_t*>(p.q) + n0 * row_bytes;
  const uint32_t flip = p.int4 ? 0u : 0x80808080u, zero_weight = p.int4 ? 0x88888888u : 0x80808080u;
  for (int64_t c = 0; c < kQgemmColumns; ++c) {
    const uint8_t* row = base + c * row_bytes;
    for (int64_t k = 0; k < row_bytes; k += 4) {
      uint32_t four = zero_weight;
      if (c < valid) {
        __builtin_memcpy(&four, row + k, 4);
        four ^= flip;
      }
      __builtin_memcpy(panel + k / 4 * kQgemmPanelRow + c * 4, &four, 4);
    }
  }
  for (int64_t g = 0; g < groups; ++g)
    for (int c = 0; c < kQgemmColumns; ++c) scales[g * kQgemmColumns + c] = c < valid ? p.scales[(n0 + c) * groups + g] : 0.0f;
}

// One block of H halves of a tile from `rows` (panel rows kQgemmPanelRow apart; H = 1: the half at
// `rows`) against R x rows: each row's exact sums of u * x per column, in int32, sums[r][h]. int8: x[r]
// is row r's split a at the block's first input (its b `in` bytes after it), and the panel bytes
// multiply a and b as they are; int4: x[r] is the quantized row, and the panel's nibbles multiply it.
template <int R, int H, bool Int4>
COLOSSAL_INLINE void block_sums(const uint8_t* rows, const int8_t* const* x, int64_t in, VI (*sums)[kTileVectors]) {
  VI acc16[R][H], low16[R][H];
  for (int r = 0; r < R; ++r)
    for (int h = 0; h < H; ++h) acc16[r][h] = low16[r][h] = zero_i();
  const auto panel_row = [&](int j, int h) __attribute__((always_inline)) { return load_i(rows + j * kQgemmPanelRow + h * kHalfBytes); };
  if constexpr (Int4) {   // 4 panel rows: low nibbles inputs 4j..4j+3, high ones 16+4j..
    const VI mask = set1_8(0x0F);
#pragma GCC unroll 1   // (unrolled, GCC hoists every row's loads ahead and spills the accumulators)
    for (int j = 0; j < 4; ++j) {
      _mm_prefetch(reinterpret_cast<const char*>(rows + j * kQgemmPanelRow + kPrefetchBytes), _MM_HINT_T0);
      VI lo[H], hi[H];
      for (int h = 0; h < H; ++h) {
        const VI v = panel_row(j, h);
        lo[h] = and_i(v, mask), hi[h] = and_i(srli16(v, 4), mask);
      }
      for (int r = 0; r < R; ++r) {
        const VI xl = broadcast4(x[r] + 4 * j), xh = broadcast4(x[r] + 16 + 4 * j);
        for (int h = 0; h < H; ++h) {
          add16(acc16[r][h], maddubs(lo[h], xl));
          add16(acc16[r][h], maddubs(hi[h], xh));
        }
      }
    }
    for (int r = 0; r < R; ++r)
      for (int h = 0; h < H; ++h) sums[r][h] = madd16(acc16[r][h], set1_16(1));
  } else {   // 8 panel rows of 4 inputs: u * a into acc16, u * b into low16
#pragma GCC unroll 1
    for (int j = 0; j < kBlock / 4; ++j) {
      _mm_prefetch(reinterpret_cast<const char*>(rows + j * kQgemmPanelRow + kPrefetchBytes), _MM_HINT_T0);
      VI u[H];
      for (int h = 0; h < H; ++h) u[h] = panel_row(j, h);
      for (int r = 0; r < R; ++r) {
        const VI a = broadcast4(x[r] + 4 * j), b = broadcast4(x[r] + in + 4 * j);
        for (int h = 0; h < H; ++h) {
          add16(acc16[r][h], maddubs(u[h], a));
          add16(low16[r][h], maddubs(u[h], b));
        }
      }
    }
    for (int r = 0; r < R; ++r)
      for (int h = 0; h < H; ++h) sums[r][h] = add32(madd16(acc16[r][h], set1_16(16)), madd16(low16[r][h], set1_16(1)));
  }
}

// Where rows from m0 meet the first H halves of a tile, which has `valid` columns (up to 16).
struct Pass {
  int64_t m0;
  const uint8_t* panel;
  const float* scales;
  int64_t n0;
  int64_t valid;
  int64_t live(int h) const {   // the columns of half h
    const int64_t v = valid - h * kHalf;
    return v < kHalf ? v : kHalf;
  }
};

// Row groups of R a block meets before the next block: each block's panel rows come from memory once
// and serve up to kGroups x R x rows from the L1 cache. (One group at a time, a decoding step's 8 rows
// read each tile in 4 passes, and only the first pass read memory: 12 layers of the 124M shape, int8,
// weights from memory, ran at 1.07x the row-layout GEMV where the same tiles in cache ran at 1.45x.)
constexpr int kGroups = 8;

// `row_groups` groups of R rows from s.m0 against H vectors of one tile: y[m0 + r][n0, + kHalf H, live).
template <int R, int H, bool Int4>
void rows_against_tile(const QgemmProblem& p, const Pass& s, int row_groups) {
  const int64_t in = p.in, blocks = in / kBlock, per_group = p.group / kBlock, groups = in / p.group;
  constexpr int32_t offset = Int4 ? 8 : 128;   // what the panel's bytes add to each weight
  constexpr int64_t block_bytes = (Int4 ? kBlock / 2 : kBlock) * kQgemmColumns;
  vf total[kGroups][R][H], acc[kGroups][R][H];
  for (int q = 0; q < row_groups; ++q)
    for (int r = 0; r < R; ++r)
      for (int h = 0; h < H; ++h) total[q][r][h] = vf{};
  for (int64_t g = 0; g < groups; ++g) {
    for (int q = 0; q < row_groups; ++q)
      for (int r = 0; r < R; ++r)
        for (int h = 0; h < H; ++h) acc[q][r][h] = vf{};
    for (int64_t b = g * per_group; b < (g + 1) * per_group; ++b) {
      for (int q = 0; q < row_groups; ++q) {
        const int64_t m0 = s.m0 + q * R;
        const int8_t* x[R];
        for (int r = 0; r < R; ++r) x[r] = (Int4 ? p.xq + (m0 + r) * in : p.split + 2 * (m0 + r) * in) + b * kBlock;
        VI sums[R][kTileVectors];
        block_sums<R, H, Int4>(s.panel + b * block_bytes, x, in, sums);
        for (int r = 0; r < R; ++r) {
          const int64_t row = (m0 + r) * blocks + b;
          const VI off = set1_32(offset * p.xsum[row]);
          const vf xs = splat(p.xs[row]);
          for (int h = 0; h < H; ++h) acc[q][r][h] = fmadd<kLanes>(to_float(sub32(sums[r][h], off)), xs, acc[q][r][h]);
        }
      }
    }
    for (int h = 0; h < H; ++h) {
      const vf w = load_u(s.scales + g * kQgemmColumns + h * kHalf);
      for (int q = 0; q < row_groups; ++q)
        for (int r = 0; r < R; ++r) total[q][r][h] = fmadd<kLanes>(w, acc[q][r][h], total[q][r][h]);
    }
  }
  for (int h = 0; h < H; ++h) {
    const int64_t n = s.n0 + h * kHalf;
    const vf bias = p.bias ? load_columns(p.bias + n, s.live(h)) : vf{};
    for (int q = 0; q < row_groups; ++q)
      for (int r = 0; r < R; ++r) store_columns(p.y + (s.m0 + q * R + r) * p.out + n, total[q][r][h] + bias, s.live(h));
  }
}

// W8A8 (p.per_row): as rows_against_tile for one int8 tile, each output's sums over all of `in`, then
// (sum * xs) * scale (+ bias), rounded as ATen's int8 GEMM path rounds (qgemm.h).
template <int R, int H>
void w8a8_rows_against_tile(const QgemmProblem& p, const Pass& s, int row_groups) {
  constexpr int64_t block_bytes = kBlock * kQgemmColumns;
  VI total[kGroups][R][H];
  for (int q = 0; q < row_groups; ++q)
    for (int r = 0; r < R; ++r)
      for (int h = 0; h < H; ++h) total[q][r][h] = zero_i();
  for (int64_t b = 0; b < p.in / kBlock; ++b)
    for (int q = 0; q < row_groups; ++q) {
      const int8_t* x[R];
      for (int r = 0; r < R; ++r) x[r] = p.split + 2 * (s.m0 + q * R + r) * p.in + b * kBlock;
      VI sums[R][kTileVectors];
      block_sums<R, H, false>(s.panel + b * block_bytes, x, p.in, sums);
      for (int r = 0; r < R; ++r)
        for (int h = 0; h < H; ++h) total[q][r][h] = add32(total[q][r][h], sums[r][h]);
    }
  for (int h = 0; h < H; ++h) {
    const int64_t n = s.n0 + h * kHalf;
    const vf w = load_u(s.scales + h * kHalf);
    for (int q = 0; q < row_groups; ++q)
      for (int r = 0; r < R; ++r) {
        const int64_t m = s.m0 + q * R + r;
        const VI exact = sub32(total[q][r][h], set1_32(128 * p.xsum[m]));
        vf y = to_float(exact) * splat(p.xs[m]) * w;
        if (p.bias) y += load_columns(p.bias + n, s.live(h));
        store_columns(p.y + m * p.out + n, y, s.live(h));
      }
  }
}

template <int R, int H>
void rows_pass(const QgemmProblem& p, const Pass& s, int row_groups) {
  if (p.per_row) w8a8_rows_against_tile<R, H>(p, s, row_groups);
  else if (p.int4) rows_against_tile<R, H, true>(p, s, row_groups);
  else rows_against_tile<R, H, false>(p, s, row_groups);
}

// Rows a group over both halves of a tile: int8's x rows take two accumulators a column each, so 2 x 2 x 2
// of AVX2's 16 registers; int4's one, so 4 x 2. (Both halves at once read each x row's broadcasts once
// for 16 columns: with 8 columns at a time and 4 rows, the int8 products ran 1.1x slower.) In 512-bit
// vectors a tile is one vector and the 32 registers take twice the rows: 4 x 2 and 8.
constexpr int kInt8Rows = kTileVectors == 1 ? 4 : 2;
constexpr int kInt4Rows = kTileVectors == 1 ? 8 : 4;

template <int H, int R = kInt4Rows - 1>
void tail_rows(const QgemmProblem& p, const Pass& s, int rows) {
  if constexpr (R >= 1) {
    if (rows == R) return rows_pass<R, H>(p, s, 1);
    tail_rows<H, R - 1>(p, s, rows);
  }
}

template <int H>
void all_rows(const QgemmProblem& p, Pass s) {
  const int per_group = p.int4 ? kInt4Rows : kInt8Rows;
  while (s.m0 + per_group <= p.rows) {
    const int64_t whole = (p.rows - s.m0) / per_group;
    const int row_groups = whole < kGroups ? static_cast<int>(whole) : kGroups;
    (p.int4 ? rows_pass<kInt4Rows, H> : rows_pass<kInt8Rows, H>)(p, s, row_groups);
    s.m0 += row_groups * per_group;
  }
  tail_rows<H>(p, s, static_cast<int>(p.rows - s.m0));   // fewer than a group
}

// All rows against one tile's panel: both halves together where the tile has more than 8 columns
// (the last tile's second half may be partial), else its first half alone; in 512-bit vectors, the
// whole tile. (Rows in chunks of 32 to 128, each chunk meeting all of a thread's tiles with its x in
// the L2 cache, measured level with this at 400 rows.)
void tile(const QgemmProblem& p, const uint8_t* panel, const float* scales, int64_t n0, int64_t valid) {
  const Pass s{0, panel, scales, n0, valid};
  if constexpr (kTileVectors == 2) {
    if (valid > kHalf) return all_rows<2>(p, s);
  }
  all_rows<1>(p, s);
}

}  // namespace

void qgemm_columns(const QgemmProblem& p, int64_t n_begin, int64_t n_end, uint8_t* scratch) {
  for_each_tile(p, n_begin, n_end, scratch, pack_tile, [&](const uint8_t* panel, const float* scales, int64_t n0, int64_t valid) {
    tile(p, panel, scales, n0, valid);
  });
}

void qgemm_pack_columns(const QgemmProblem& p, int64_t n_begin, int64_t n_end, uint8_t* panels, float* panel_scales) {
  pack_each_tile(p, n_begin, n_end, panels, panel_scales, pack_tile);
}

}  // namespace colossal::kernels::COLOSSAL_ISA
#endif
