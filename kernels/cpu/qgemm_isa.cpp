// Quantized GEMM, the VNNI copy (compiled only for the avx512vnni set): see qgemm.h for the layout.
#include "kernels/cpu/isa_entry.h"
#include "kernels/cpu/qgemm.h"

#include <immintrin.h>

// GCC 12's 512-bit conversion, gather and masked intrinsics start from _mm512_undefined_*, which -O3
// reports as maybe uninitialized wherever they inline.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace colossal::kernels::COLOSSAL_ISA {
namespace {

constexpr int kBlock = 32;            // inputs per x scale
// x rows a tile: 6 x 3 vectors of sums (integer, per block, per group); 8 x 3 left too few of the
// 32 registers and spilled (313 against 445 GMAC/s here, 4 to 7 rows all within 10% of 6).
constexpr int kRows = 6;
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

// x row r's 4 bytes from `at`, in every lane.
inline __attribute__((always_inline)) __m512i broadcast4(const int8_t* at) {
  int32_t four;
  __builtin_memcpy(&four, at, 4);
  return _mm512_set1_epi32(four);
}

// R rows from m0 against one tile's panel: y[m0 + r][n0, n0 + valid). (With one or two rows the 8
// vpdpbusd of a block are one dependent chain; two chains measured the same: the weights' stream
// paces those rows.)
template <int R, bool Int4>
void tile_rows(const QgemmProblem& p, int64_t m0, const uint8_t* panel, const float* scales, int64_t n0, int64_t valid) {
  const int64_t in = p.in, blocks = in / kBlock, per_group = p.group / kBlock, groups = in / p.group;
  constexpr int32_t offset = Int4 ? 8 : 128;   // what the panel's bytes add to each weight
  constexpr int64_t block_bytes = (Int4 ? kBlock / 2 : kBlock) * kQgemmColumns;
  const int8_t* x[R];
  for (int r = 0; r < R; ++r) x[r] = p.xq + (m0 + r) * in;
  __m512 total[R];
  for (int r = 0; r < R; ++r) total[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m512 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    for (int64_t b = g * per_group; b < (g + 1) * per_group; ++b) {
      __m512i sums[R];
      for (int r = 0; r < R; ++r) sums[r] = _mm512_setzero_si512();
      const uint8_t* rows = panel + b * block_bytes;
      if constexpr (Int4) {
        const __m512i low = _mm512_set1_epi8(0x0F);
        for (int j = 0; j < 4; ++j) {
          _mm_prefetch(reinterpret_cast<const char*>(rows + j * kQgemmPanelRow + kPrefetchBytes), _MM_HINT_T0);
          const __m512i v = _mm512_loadu_si512(rows + j * kQgemmPanelRow);
          const __m512i lo = _mm512_and_si512(v, low), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
          for (int r = 0; r < R; ++r) {
            sums[r] = _mm512_dpbusd_epi32(sums[r], lo, broadcast4(x[r] + b * kBlock + 4 * j));
            sums[r] = _mm512_dpbusd_epi32(sums[r], hi, broadcast4(x[r] + b * kBlock + 16 + 4 * j));
          }
        }
      } else {
        for (int j = 0; j < kBlock / 4; ++j) {
          _mm_prefetch(reinterpret_cast<const char*>(rows + j * kQgemmPanelRow + kPrefetchBytes), _MM_HINT_T0);
          const __m512i w = _mm512_loadu_si512(rows + j * kQgemmPanelRow);
          for (int r = 0; r < R; ++r) sums[r] = _mm512_dpbusd_epi32(sums[r], w, broadcast4(x[r] + b * kBlock + 4 * j));
        }
      }
      for (int r = 0; r < R; ++r) {
        const int64_t row = (m0 + r) * blocks + b;
        const __m512i exact = _mm512_sub_epi32(sums[r], _mm512_set1_epi32(offset * p.xsum[row]));
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(exact), _mm512_set1_ps(p.xs[row]), acc[r]);
      }
    }
    const __m512 s = _mm512_loadu_ps(scales + g * kQgemmColumns);
    for (int r = 0; r < R; ++r) total[r] = _mm512_fmadd_ps(s, acc[r], total[r]);
  }
  const __mmask16 live = live_columns(valid);
  const __m512 bias = p.bias ? _mm512_maskz_loadu_ps(live, p.bias + n0) : _mm512_setzero_ps();
  for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(p.y + (m0 + r) * p.out + n0, live, _mm512_add_ps(total[r], bias));
}

template <bool Int4>
void tile(const QgemmProblem& p, const uint8_t* panel, const float* scales, int64_t n0, int64_t valid) {
  int64_t m = 0;
  for (; m + kRows <= p.rows; m += kRows) tile_rows<kRows, Int4>(p, m, panel, scales, n0, valid);
  switch (p.rows - m) {
    case 5: tile_rows<5, Int4>(p, m, panel, scales, n0, valid); break;
    case 4: tile_rows<4, Int4>(p, m, panel, scales, n0, valid); break;
    case 3: tile_rows<3, Int4>(p, m, panel, scales, n0, valid); break;
    case 2: tile_rows<2, Int4>(p, m, panel, scales, n0, valid); break;
    case 1: tile_rows<1, Int4>(p, m, panel, scales, n0, valid); break;
    default: break;
  }
}

}  // namespace

void qgemm_columns(const QgemmProblem& p, int64_t n_begin, int64_t n_end, uint8_t* scratch) {
  const int64_t tile_bytes = p.in * kQgemmColumns / (p.int4 ? 2 : 1), groups = p.in / p.group;
  for (int64_t n0 = n_begin; n0 < n_end; n0 += kQgemmColumns) {
    const int64_t valid = n_end - n0 < kQgemmColumns ? n_end - n0 : kQgemmColumns;
    const uint8_t* panel = scratch;
    const float* scales = reinterpret_cast<const float*>(scratch + p.in * kQgemmColumns);
    if (p.panels) {
      panel = p.panels + n0 / kQgemmColumns * tile_bytes;
      scales = p.panel_scales + n0 / kQgemmColumns * groups * kQgemmColumns;
    } else {
      pack_tile(p, n0, valid, scratch, reinterpret_cast<float*>(scratch + p.in * kQgemmColumns));
    }
    (p.int4 ? tile<true> : tile<false>)(p, panel, scales, n0, valid);
  }
}

void qgemm_pack_columns(const QgemmProblem& p, int64_t n_begin, int64_t n_end, uint8_t* panels, float* panel_scales) {
  const int64_t tile_bytes = p.in * kQgemmColumns / (p.int4 ? 2 : 1), groups = p.in / p.group;
  for (int64_t n0 = n_begin; n0 < n_end; n0 += kQgemmColumns) {
    const int64_t t = n0 / kQgemmColumns, valid = n_end - n0 < kQgemmColumns ? n_end - n0 : kQgemmColumns;
    pack_tile(p, n0, valid, panels + t * tile_bytes, panel_scales + t * groups * kQgemmColumns);
  }
}

}  // namespace colossal::kernels::COLOSSAL_ISA
