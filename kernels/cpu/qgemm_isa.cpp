// Quantized GEMM, the VNNI copy (compiled for the avx512vnni set, and again with AMX for the amx set):
// see qgemm.h for the layout.
#include "kernels/cpu/isa_entry.h"
#include "kernels/cpu/qgemm.h"
#include "kernels/cpu/qgemm_tiles.h"

#include <immintrin.h>

#include <algorithm>
#include <type_traits>
#include <vector>

// GCC 12's 512-bit conversion, gather and masked intrinsics start from _mm512_undefined_*, which -O3
// reports as (maybe) uninitialized wherever they inline.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace colossal::kernels::COLOSSAL_ISA {
namespace {

constexpr int kBlock = 32;            // inputs per x scale
// x rows a pass: 6 x 3 vectors of sums (integer, per block, per group) for one tile; 8 x 3 left too
// few of the 32 registers and spilled (313 against 445 GMAC/s here, 4 to 7 rows all within 10% of 6).
// Over two tiles, 6 and 8 rows measured the same (the group's sums spill either way, touched once a
// group) and 4 0.92x. A last pass takes up to 8 rows: 8 = 6 + 2 had run the 2-row pass at half the
// rate of the 6 (its 8 vpdpbusd a block one dependent chain).
constexpr int kRows = 6;
constexpr int kLastRows = 8;
// Packed at load, the weights stream from memory one tile after another, and the hardware prefetcher
// falls behind: each panel row (one cache line) asks for the one 4 KiB ahead. Measured on the 124M
// shape's 48 layers at 8 rows: int8 3.6 -> 2.4 ms, int4 2.3 -> 1.6 ms; 2 and 8 KiB were no better.
constexpr int64_t kPrefetchBytes = 4096;

// The tile's first `valid` columns, as a lane mask.
__mmask16 live_columns(int64_t valid) { return valid >= kQgemmColumns ? __mmask16(0xFFFF) : __mmask16((1u << valid) - 1); }

// The tile's weights as panel rows (qgemm.h: int8 + 128, or int4's stored bytes) and its scales
// [group][16]. Columns past `valid` are zero weights (the offset itself) with zero scales.
void pack_tile(const QgemmProblem& p, int64_t n0, int64_t valid, uint8_t* panel, float* scales) {
  const int64_t in = p.in, groups = in / p.group, row_bytes = p.int4 ? in / 2 : in;
  // Row offsets of the 16 columns (the last valid one repeated past the end, its values masked).
  int32_t offsets[kQgemmColumns];
  for (int c = 0; c < kQgemmColumns; ++c) offsets[c] = static_cast<int32_t>((c < valid ? c : valid - 1) * row_bytes);
  const __m512i rows = _mm512_loadu_si512(offsets);
  const __mmask16 live = live_columns(valid);
  const uint8_t* base = static_cast<const uint8_t*>(p.q) + n0 * row_bytes;
  // int4: a block of 32 inputs is 16 bytes, and 4 bytes of each column make a panel row whole.
  const __m512i flip = p.int4 ? _mm512_setzero_si512() : _mm512_set1_epi8(static_cast<char>(0x80));
  const __m512i zero_weight = _mm512_set1_epi8(static_cast<char>(p.int4 ? 0x88 : 0x80));
  for (int64_t k = 0; k < row_bytes; k += 4) {
    const __m512i v = _mm512_i32gather_epi32(rows, base + k, 1);
    _mm512_storeu_si512(panel + k / 4 * kQgemmPanelRow, _mm512_mask_blend_epi32(live, zero_weight, _mm512_xor_si512(v, flip)));
  }
  for (int64_t g = 0; g < groups; ++g)
    for (int c = 0; c < kQgemmColumns; ++c) scales[g * kQgemmColumns + c] = c < valid ? p.scales[(n0 + c) * groups + g] : 0.0f;
}

// A pass's x rows as the tile loop reads them: a block's 32 bytes of row r, where its sums start and its
// scale. RowMajor reads quantize_rows' own layout ([rows][in], block values [rows][blocks]), a general
// register per row; BlockMajor a decoding step's rows as qgemm_step_rows laid them out, one pointer for
// all R rows (at 8 rows and two tiles, GCC had run out of general registers and reloaded the rows'
// offsets from the stack every block: 1.1x).
struct RowMajor {
  const int8_t* xq;      // the pass's first row
  const int32_t* start;  // [rows][blocks], from the pass's first row
  const float* xs;
  int64_t in, blocks;
  const int8_t* x(int r, int64_t b) const { return xq + r * in + b * kBlock; }
  int32_t start_at(int r, int64_t b) const { return start[r * blocks + b]; }
  float scale_at(int r, int64_t b) const { return xs[r * blocks + b]; }
};
template <int R>
struct BlockMajor {
  const int8_t* xq;
  const int32_t* start;
  const float* xs;
  const int8_t* x(int r, int64_t b) const { return xq + (b * R + r) * kBlock; }
  int32_t start_at(int r, int64_t b) const { return start[b * R + r]; }
  float scale_at(int r, int64_t b) const { return xs[b * R + r]; }
};

// Where each x row's integer sums of each block start (qgemm_block_start). Broadcast from memory, a
// start costs a load and no vector instruction, where subtracting the offset after took a subtraction
// and a broadcast from a general register (at 8 rows, with the general registers all taken, GCC moved
// the values through mask registers: six vector-port instructions beside a block's 8 products). Every
// row's, row-major (RowMajor's), in the calling thread's buffer; qgemm_step_rows lays out a decoding
// step's.
const int32_t* start_sums(const QgemmProblem& p) {
  thread_local std::vector<int32_t> start;
  const int64_t n = p.rows * (p.in / kBlock);
  if (static_cast<int64_t>(start.size()) < n) start.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) start[i] = qgemm_block_start(p.int4, p.xsum[i]);
  return start.data();
}

// x row r's 4 bytes from `at`, in every lane.
inline __attribute__((always_inline)) __m512i broadcast4(const int8_t* at) {
  int32_t four;
  __builtin_memcpy(&four, at, 4);
  return _mm512_set1_epi32(four);
}

// R rows from m0 against T consecutive tiles of a packed weight (panel, then the next tile's T - 1 panels
// and scales on; T = 2 only where qgemm_pack laid them out): y[m0 + r][n0, n0 + 16 (T - 1) + valid).
// Each broadcast of an x row's 4 bytes serves the T tiles: at 8 rows and one tile, the 64 broadcasts
// of a block's 64 vpdpbusd filled the two load ports that 512-bit loads have on Intel (one product a
// cycle, half the two that the vector ports take); two tiles halve them. (With one or two rows the 8
// vpdpbusd of a block are one dependent chain; two chains measured the same: the weights' stream
// paces those rows.)
template <int R, bool Int4, int T = 1, class Rows>
void tile_rows(const QgemmProblem& p, int64_t m0, const Rows& xr, const uint8_t* panel, const float* scales, int64_t n0, int64_t valid) {
  const int64_t in = p.in, per_group = p.group / kBlock, groups = in / p.group;
  constexpr int64_t block_bytes = (Int4 ? kBlock / 2 : kBlock) * kQgemmColumns;
  const int64_t tile_bytes = in * kQgemmColumns / (Int4 ? 2 : 1), tile_scales = groups * kQgemmColumns;
  __m512 total[T][R];
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < R; ++r) total[t][r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m512 acc[T][R];
    for (int t = 0; t < T; ++t)
      for (int r = 0; r < R; ++r) acc[t][r] = _mm512_setzero_ps();
    for (int64_t b = g * per_group; b < (g + 1) * per_group; ++b) {
      __m512i sums[T][R];
      for (int r = 0; r < R; ++r) sums[0][r] = _mm512_set1_epi32(xr.start_at(r, b));
      for (int t = 1; t < T; ++t)
        for (int r = 0; r < R; ++r) sums[t][r] = sums[0][r];
      const uint8_t* rows = panel + b * block_bytes;
      if constexpr (Int4) {
        const __m512i low = _mm512_set1_epi8(0x0F);
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) {
          __m512i lo[T], hi[T];
          for (int t = 0; t < T; ++t) {
            const uint8_t* at = rows + t * tile_bytes + j * kQgemmPanelRow;
            _mm_prefetch(reinterpret_cast<const char*>(at + kPrefetchBytes), _MM_HINT_T0);
            const __m512i v = _mm512_loadu_si512(at);
            lo[t] = _mm512_and_si512(v, low), hi[t] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
          }
          for (int r = 0; r < R; ++r) {
            const __m512i xl = broadcast4(xr.x(r, b) + 4 * j), xh = broadcast4(xr.x(r, b) + 16 + 4 * j);
            for (int t = 0; t < T; ++t) {
              sums[t][r] = _mm512_dpbusd_epi32(sums[t][r], lo[t], xl);
              sums[t][r] = _mm512_dpbusd_epi32(sums[t][r], hi[t], xh);
            }
          }
        }
      } else {
#pragma GCC unroll 8
        for (int j = 0; j < kBlock / 4; ++j) {
          __m512i w[T];
          for (int t = 0; t < T; ++t) {
            const uint8_t* at = rows + t * tile_bytes + j * kQgemmPanelRow;
            _mm_prefetch(reinterpret_cast<const char*>(at + kPrefetchBytes), _MM_HINT_T0);
            w[t] = _mm512_loadu_si512(at);
          }
          for (int r = 0; r < R; ++r) {
            const __m512i xb = broadcast4(xr.x(r, b) + 4 * j);
            for (int t = 0; t < T; ++t) sums[t][r] = _mm512_dpbusd_epi32(sums[t][r], w[t], xb);
          }
        }
      }
      for (int r = 0; r < R; ++r) {
        const __m512 xs = _mm512_set1_ps(xr.scale_at(r, b));
        for (int t = 0; t < T; ++t) acc[t][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[t][r]), xs, acc[t][r]);
      }
    }
    for (int t = 0; t < T; ++t) {
      const __m512 s = _mm512_loadu_ps(scales + t * tile_scales + g * kQgemmColumns);
      for (int r = 0; r < R; ++r) total[t][r] = _mm512_fmadd_ps(s, acc[t][r], total[t][r]);
    }
  }
  for (int t = 0; t < T; ++t) {
    const __mmask16 live = live_columns(t + 1 < T ? kQgemmColumns : valid);
    const int64_t n = n0 + t * kQgemmColumns;
    const __m512 bias = p.bias ? _mm512_maskz_loadu_ps(live, p.bias + n) : _mm512_setzero_ps();
    for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(p.y + (m0 + r) * p.out + n, live, _mm512_add_ps(total[t][r], bias));
  }
}

// W8A8 (p.per_row): R rows from m0 against one int8 tile's panel, each output's sums over all of `in`,
// then (sum * xs) * scale (+ bias), each rounded as ATen's int8 GEMM path rounds (qgemm.h).
template <int R>
void w8a8_rows(const QgemmProblem& p, int64_t m0, const uint8_t* panel, const float* scales, int64_t n0, int64_t valid) {
  const int8_t* x[R];
  for (int r = 0; r < R; ++r) x[r] = p.xq + (m0 + r) * p.in;
  __m512i sums[R];
  for (int r = 0; r < R; ++r) sums[r] = _mm512_setzero_si512();
  for (int64_t j = 0; j < p.in / 4; ++j) {
    _mm_prefetch(reinterpret_cast<const char*>(panel + j * kQgemmPanelRow + kPrefetchBytes), _MM_HINT_T0);
    const __m512i w = _mm512_loadu_si512(panel + j * kQgemmPanelRow);
    for (int r = 0; r < R; ++r) sums[r] = _mm512_dpbusd_epi32(sums[r], w, broadcast4(x[r] + 4 * j));
  }
  const __mmask16 live = live_columns(valid);
  const __m512 s = _mm512_loadu_ps(scales);
  for (int r = 0; r < R; ++r) {
    const __m512i exact = _mm512_sub_epi32(sums[r], _mm512_set1_epi32(128 * p.xsum[m0 + r]));
    __m512 y = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(exact), _mm512_set1_ps(p.xs[m0 + r])), s);
    if (p.bias) y = _mm512_add_ps(y, _mm512_maskz_loadu_ps(live, p.bias + n0));
    _mm512_mask_storeu_ps(p.y + (m0 + r) * p.out + n0, live, y);
  }
}

#if defined(__AMX_INT8__)
// AMX (the amx set's copy): 16 x rows at a time meet a block of the panel in one tile instruction.
// x's scale is per block of 32 inputs, so each block's int32 sums leave the tiles (a tile store) and
// take the VNNI loop's own operations in the same order: minus the offset times the block's x sum,
// to float, times the x scale, summed over the group, then times the weights' scale. So the bits are
// the VNNI copy's, and only the integer products moved to the tiles. The panel's 64-byte rows are
// already a tile of the weights (8 rows of 4 inputs x 16 columns per block); each tile of columns is
// made signed bytes once (signed_weight_tiles) for tdpbssd. Measured on a Xeon with AMX (768 x 2304
// packed int8, 64 rows, one thread): 0.47 ms against the VNNI loop's 0.59; the scaling of each block's
// sums on the vector units, which do not overlap the tile unit, bounds it (README, "AMX tiles").
constexpr int kTileRows = 16;
constexpr int64_t kBlockTileBytes = kBlock / 4 * kQgemmPanelRow;   // a block's weights as a tile: 8 rows of 64 bytes

struct alignas(64) TileConfig {   // ldtilecfg's 64 bytes, palette 1
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles 0 and 1: a block's sums (16 rows of 16 int32), for alternate blocks; 2 and 3: their x rows (16
// rows of 32 bytes); 4 and 5: their weights (8 rows of 64 bytes). Per thread: each OpenMP thread that
// runs the tile loop configures its own tiles and releases them after.
void configure_tiles() {
  TileConfig c;
  for (int t = 0; t < 2; ++t) {
    c.colsb[t] = 64, c.rows[t] = kTileRows;
    c.colsb[2 + t] = kBlock, c.rows[2 + t] = kTileRows;
    c.colsb[4 + t] = kQgemmPanelRow, c.rows[4 + t] = kBlock / 4;
  }
  _tile_loadconfig(&c);
}

// A block's products of 16 x rows (from x, rows `ld` bytes apart) and its weight tile, summed into tile
// T (0 or 1, with its x and weight tiles; the tile intrinsics take register numbers as literals), and
// the sums stored as [16][16] int32. The multiply of a pair's second block is issued before the first
// block's store, which waits for its multiply to finish.
#define COLOSSAL_BLOCK_PRODUCT(T, X_TILE, W_TILE, x, ld, weights) \
  do {                                                           \
    _tile_zero(T);                                               \
    _tile_loadd(X_TILE, (x), (ld));                              \
    _tile_loadd(W_TILE, (weights), kQgemmPanelRow);              \
    _tile_dpbssd(T, X_TILE, W_TILE);                             \
  } while (0)

// The tile's weights as signed bytes, a 512-byte weight tile per block, so the tiles' sums need no
// offset taken off (the VNNI loop's unsigned panel minus offset x the x sum: the same integers). int8:
// the panel less its offset of 128. int4: each stored byte holds two inputs, a block's low nibbles
// being its inputs 0-15 (tile rows 0-3) and the high ones 16-31 (rows 4-7), less the offset of 8.
template <bool Int4>
void signed_weight_tiles(const uint8_t* panel, int64_t blocks, int8_t* out) {
  if constexpr (Int4) {
    const __m512i low = _mm512_set1_epi8(0x0F), eight = _mm512_set1_epi8(8);
    for (int64_t b = 0; b < blocks; ++b)
      for (int j = 0; j < 4; ++j) {
        const __m512i v = _mm512_loadu_si512(panel + (b * 4 + j) * kQgemmPanelRow);
        int8_t* tile = out + b * kBlockTileBytes;
        _mm512_store_si512(tile + j * kQgemmPanelRow, _mm512_sub_epi8(_mm512_and_si512(v, low), eight));
        _mm512_store_si512(tile + (4 + j) * kQgemmPanelRow, _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(v, 4), low), eight));
      }
  } else {
    const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
    for (int64_t i = 0; i < blocks * kBlockTileBytes; i += kQgemmPanelRow)
      _mm512_store_si512(out + i, _mm512_xor_si512(_mm512_loadu_si512(panel + i), flip));
  }
}

// Rows [m0, m0 + 16) against one tile's weights `w` (a weight tile per block): y[m0 + r][n0, n0 + valid).
// `sums` is 2 x 256 int32 of the thread's, 64-byte aligned. Two blocks go to the tiles before either's
// sums are scaled, so the tile unit works on the second while the vector units scale the first. The
// group totals wait in memory: with the 16 sums in registers they would spill anyway.
template <bool Int4>
void amx_rows(const QgemmProblem& p, int64_t m0, const int8_t* w, const float* scales, int64_t n0, int64_t valid, int32_t* sums) {
  const int64_t in = p.in, blocks = in / kBlock, per_group = p.group / kBlock;
  const int8_t* x = p.xq + m0 * in;
  alignas(64) float total[kTileRows * kQgemmColumns] = {};
  __m512 acc[kTileRows];
  for (int r = 0; r < kTileRows; ++r) acc[r] = _mm512_setzero_ps();
  int64_t in_group = 0, group = 0;
  auto scale_block = [&](int64_t b, const int32_t* s) __attribute__((always_inline)) {
    for (int r = 0; r < kTileRows; ++r) {
      const int64_t row = (m0 + r) * blocks + b;
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(s + r * kQgemmColumns)), _mm512_set1_ps(p.xs[row]), acc[r]);
    }
    if (++in_group < per_group) return;
    const __m512 sg = _mm512_loadu_ps(scales + group++ * kQgemmColumns);
    for (int r = 0; r < kTileRows; ++r) {
      float* t = total + r * kQgemmColumns;
      _mm512_store_ps(t, _mm512_fmadd_ps(sg, acc[r], _mm512_load_ps(t)));
      acc[r] = _mm512_setzero_ps();
    }
    in_group = 0;
  };
  for (int64_t b = 0; b < blocks; b += 2) {
    const bool pair = b + 1 < blocks;
    COLOSSAL_BLOCK_PRODUCT(0, 2, 4, x + b * kBlock, in, w + b * kBlockTileBytes);
    if (pair) COLOSSAL_BLOCK_PRODUCT(1, 3, 5, x + (b + 1) * kBlock, in, w + (b + 1) * kBlockTileBytes);
    _tile_stored(0, sums, 64);
    if (pair) _tile_stored(1, sums + 256, 64);
    scale_block(b, sums);
    if (pair) scale_block(b + 1, sums + 256);
  }
  const __mmask16 live = live_columns(valid);
  const __m512 bias = p.bias ? _mm512_maskz_loadu_ps(live, p.bias + n0) : _mm512_setzero_ps();
  for (int r = 0; r < kTileRows; ++r)
    _mm512_mask_storeu_ps(p.y + (m0 + r) * p.out + n0, live, _mm512_add_ps(_mm512_load_ps(total + r * kQgemmColumns), bias));
}
#undef COLOSSAL_BLOCK_PRODUCT

// W8A8 tiles (x per row, so no block scales between the products): tiles 0 and 1 sum alternate steps
// of 64 inputs (two chains for the tile unit), over x tiles 2 and 3 (16 rows of 64 bytes) and weight
// tiles 4 and 5 (16 panel rows: 64 inputs x 16 columns); a last 32 inputs take tiles 6 and 7 (16 rows of
// 32 bytes, 8 panel rows).
void configure_w8a8_tiles() {
  TileConfig c;
  for (int t = 0; t < 6; ++t) c.colsb[t] = 64, c.rows[t] = kTileRows;
  c.colsb[6] = kBlock, c.rows[6] = kTileRows;
  c.colsb[7] = kQgemmPanelRow, c.rows[7] = kBlock / 4;
  _tile_loadconfig(&c);
}

// Rows [m0, m0 + 16) against one int8 tile's panel (as w8a8_rows). `sums` is 2 x 256 int32, aligned.
void w8a8_amx_rows(const QgemmProblem& p, int64_t m0, const uint8_t* panel, const float* scales, int64_t n0, int64_t valid, int32_t* sums) {
  const int64_t in = p.in, steps = in / 64;
  const int8_t* x = p.xq + m0 * in;
  _tile_zero(0);
  _tile_zero(1);
  int64_t i = 0;
  for (; i + 2 <= steps; i += 2) {
    _tile_loadd(2, x + i * 64, in);
    _tile_loadd(4, panel + i * 16 * kQgemmPanelRow, kQgemmPanelRow);
    _tile_dpbsud(0, 2, 4);
    _tile_loadd(3, x + (i + 1) * 64, in);
    _tile_loadd(5, panel + (i + 1) * 16 * kQgemmPanelRow, kQgemmPanelRow);
    _tile_dpbsud(1, 3, 5);
  }
  if (i < steps) {
    _tile_loadd(2, x + i * 64, in);
    _tile_loadd(4, panel + i * 16 * kQgemmPanelRow, kQgemmPanelRow);
    _tile_dpbsud(0, 2, 4);
  }
  if (in % 64) {
    _tile_loadd(6, x + steps * 64, in);
    _tile_loadd(7, panel + steps * 16 * kQgemmPanelRow, kQgemmPanelRow);
    _tile_dpbsud(1, 6, 7);
  }
  _tile_stored(0, sums, 64);
  _tile_stored(1, sums + 256, 64);
  const __mmask16 live = live_columns(valid);
  const __m512 s = _mm512_loadu_ps(scales);
  const __m512 bias = p.bias ? _mm512_maskz_loadu_ps(live, p.bias + n0) : _mm512_setzero_ps();
  for (int r = 0; r < kTileRows; ++r) {
    const __m512i total = _mm512_add_epi32(_mm512_load_si512(sums + r * kQgemmColumns), _mm512_load_si512(sums + 256 + r * kQgemmColumns));
    const __m512i exact = _mm512_sub_epi32(total, _mm512_set1_epi32(128 * p.xsum[m0 + r]));
    __m512 y = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(exact), _mm512_set1_ps(p.xs[m0 + r])), s);
    if (p.bias) y = _mm512_add_ps(y, bias);
    _mm512_mask_storeu_ps(p.y + (m0 + r) * p.out + n0, live, y);
  }
}
#endif

// f(std::integral_constant<int, rows>{}) for 1 <= rows <= kLastRows (nothing for 0).
template <class F>
void with_rows(int64_t rows, const F& f) {
  switch (rows) {
    case 8: return f(std::integral_constant<int, 8>{});
    case 7: return f(std::integral_constant<int, 7>{});
    case 6: return f(std::integral_constant<int, 6>{});
    case 5: return f(std::integral_constant<int, 5>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 3: return f(std::integral_constant<int, 3>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 1: return f(std::integral_constant<int, 1>{});
    default: return;
  }
}
static_assert(kLastRows == 8 && kQgemmStepRows == 8, "with_rows covers the rows of a last pass and of a decoding step");

// pass(rows, m0, x rows) over the rows from m on as RowMajor passes: of kRows, then a last of up to kLastRows.
template <class Pass>
void row_major_passes(const QgemmProblem& p, int64_t m, const int32_t* start, const Pass& pass) {
  const int64_t blocks = p.in / kBlock;
  auto rows_from = [&](int64_t m0) { return RowMajor{p.xq + m0 * p.in, start + m0 * blocks, p.xs + m0 * blocks, p.in, blocks}; };
  for (; p.rows - m > kLastRows; m += kRows) pass(std::integral_constant<int, kRows>{}, m, rows_from(m));
  with_rows(p.rows - m, [&](auto rows) { pass(rows, m, rows_from(m)); });
}

// All rows against one tile's panel; `amx` (the amx set only) is the thread's tile scratch, or null
// where the rows take the VNNI loop alone. (Prefetching the next tile's panel during the first 16 rows
// measured level with the hardware's own prefetch, and slower for W8A8's 1560-row prompts.)
template <bool Int4>
void tile(const QgemmProblem& p, const uint8_t* panel, const float* scales, int64_t n0, int64_t valid, [[maybe_unused]] uint8_t* amx,
          const int32_t* start) {
  int64_t m = 0;
  if (p.per_row) {   // W8A8: int8 panels only
#if defined(__AMX_INT8__)
    if (amx)
      for (; m + kTileRows <= p.rows; m += kTileRows) w8a8_amx_rows(p, m, panel, scales, n0, valid, reinterpret_cast<int32_t*>(amx));
#endif
    for (; m + kRows <= p.rows; m += kRows) w8a8_rows<kRows>(p, m, panel, scales, n0, valid);
    switch (p.rows - m) {
      case 5: w8a8_rows<5>(p, m, panel, scales, n0, valid); break;
      case 4: w8a8_rows<4>(p, m, panel, scales, n0, valid); break;
      case 3: w8a8_rows<3>(p, m, panel, scales, n0, valid); break;
      case 2: w8a8_rows<2>(p, m, panel, scales, n0, valid); break;
      case 1: w8a8_rows<1>(p, m, panel, scales, n0, valid); break;
      default: break;
    }
    return;
  }
#if defined(__AMX_INT8__)
  if (amx) {
    int32_t* sums = reinterpret_cast<int32_t*>(amx);
    int8_t* w = reinterpret_cast<int8_t*>(amx + kQgemmAmxSums);
    signed_weight_tiles<Int4>(panel, p.in / kBlock, w);
    for (; m + kTileRows <= p.rows; m += kTileRows) amx_rows<Int4>(p, m, w, scales, n0, valid, sums);
  }
#endif
  row_major_passes(p, m, start, [&](auto rows, int64_t m0, const RowMajor& xr) {
    tile_rows<decltype(rows)::value, Int4>(p, m0, xr, panel, scales, n0, valid);
  });
}

// All rows against the tiles of [n_begin, n_end) packed at load, two tiles at a time where two are left:
// a decoding step's rows (p.step_x's) in one pass, others in passes of kRows as tile() takes them.
template <bool Int4>
void tile_pairs(const QgemmProblem& p, int64_t n_begin, int64_t n_end, const int32_t* start) {
  const int64_t groups = p.in / p.group;
  for (int64_t n0 = n_begin; n0 < n_end; n0 += 2 * kQgemmColumns) {
    const int64_t t = n0 / kQgemmColumns;
    const uint8_t* panel = p.panels + t * qgemm_tile_bytes(p);
    const float* scales = p.panel_scales + t * groups * kQgemmColumns;
    auto pass = [&](auto rows, int64_t m0, const auto& xr) {
      constexpr int R = decltype(rows)::value;
      if (n_end - n0 > kQgemmColumns)
        tile_rows<R, Int4, 2>(p, m0, xr, panel, scales, n0, std::min<int64_t>(n_end - n0 - kQgemmColumns, kQgemmColumns));
      else
        tile_rows<R, Int4>(p, m0, xr, panel, scales, n0, n_end - n0);
    };
    if (p.step_x)
      with_rows(p.rows, [&](auto rows) { pass(rows, 0, BlockMajor<decltype(rows)::value>{p.step_x, p.step_start, p.step_xs}); });
    else
      row_major_passes(p, 0, start, pass);
  }
}

}  // namespace

void qgemm_columns(const QgemmProblem& p, int64_t n_begin, int64_t n_end, uint8_t* scratch) {
  uint8_t* amx = nullptr;
#if defined(__AMX_INT8__)
  if (scratch && p.rows >= kTileRows) {   // a decoding step's few rows keep the VNNI loop, and the tiles unconfigured
    amx = scratch + qgemm_scratch_bytes(p.in, p.group) - qgemm_amx_scratch_bytes(p.in);
    amx += (64 - reinterpret_cast<uintptr_t>(amx) % 64) % 64;
    if (p.per_row) configure_w8a8_tiles();
    else configure_tiles();
  }
#endif
  const bool pairs = p.panels && !p.per_row && !amx;   // (weights packed per call have one tile's room in the scratch)
  const int32_t* start = p.per_row || (pairs && p.step_x) ? nullptr : start_sums(p);
  if (pairs) {
    (p.int4 ? tile_pairs<true> : tile_pairs<false>)(p, n_begin, n_end, start);
    return;
  }
  for_each_tile(p, n_begin, n_end, scratch, pack_tile, [&](const uint8_t* panel, const float* scales, int64_t n0, int64_t valid) {
    (p.int4 ? tile<true> : tile<false>)(p, panel, scales, n0, valid, amx, start);
  });
#if defined(__AMX_INT8__)
  if (amx) _tile_release();   // back to the initial state: no 8 KiB of tile registers to save at each switch
#endif
}

void qgemm_pack_columns(const QgemmProblem& p, int64_t n_begin, int64_t n_end, uint8_t* panels, float* panel_scales) {
  pack_each_tile(p, n_begin, n_end, panels, panel_scales, pack_tile);
}

}  // namespace colossal::kernels::COLOSSAL_ISA
