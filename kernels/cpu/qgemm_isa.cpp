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
constexpr int64_t kPanelRow = 64;     // bytes of a panel row: 4 inputs of 16 columns

// The tile's first `valid` columns, as a lane mask.
__mmask16 live_columns(int64_t valid) { return valid >= kQgemmColumns ? __mmask16(0xFFFF) : __mmask16((1u << valid) - 1); }

// The tile's weights as panel rows of unsigned bytes (int8 + 128, int4's stored nibble) and its
// scales [group][16]. Columns past `valid` are zero weights (the offset itself) with zero scales.
void pack_tile(const QgemmProblem& p, int64_t n0, int64_t valid, uint8_t* panel, float* scales) {
  const int64_t in = p.in, groups = in / p.group, row_bytes = p.int4 ? in / 2 : in;
  // Row offsets of the 16 columns (the last valid one repeated past the end, its values masked).
  int32_t offsets[kQgemmColumns];
  for (int c = 0; c < kQgemmColumns; ++c) offsets[c] = static_cast<int32_t>((c < valid ? c : valid - 1) * row_bytes);
  const __m512i rows = _mm512_loadu_si512(offsets);
  const __mmask16 live = live_columns(valid);
  const uint8_t* base = static_cast<const uint8_t*>(p.q) + n0 * row_bytes;
  if (p.int4) {
    // A block of 32 inputs is 16 bytes: byte j holds input j (low nibble) and j + 16 (high). Four bytes
    // j..j+3 give inputs j..j+3 (low) and j+16..j+19 (high): two panel rows from one gather.
    const __m512i low = _mm512_set1_epi32(0x0F0F0F0F), zero_weight = _mm512_set1_epi8(8);
    for (int64_t b = 0; b < in / kBlock; ++b)
      for (int j = 0; j < 16; j += 4) {
        const __m512i v = _mm512_i32gather_epi32(rows, base + b * 16 + j, 1);
        const __m512i lo = _mm512_mask_blend_epi32(live, zero_weight, _mm512_and_si512(v, low));
        const __m512i hi = _mm512_mask_blend_epi32(live, zero_weight, _mm512_and_si512(_mm512_srli_epi32(v, 4), low));
        _mm512_storeu_si512(panel + (b * kBlock + j) / 4 * kPanelRow, lo);
        _mm512_storeu_si512(panel + (b * kBlock + j + 16) / 4 * kPanelRow, hi);
      }
  } else {
    const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80)), zero_weight = flip;
    for (int64_t k = 0; k < in; k += 4) {
      const __m512i v = _mm512_i32gather_epi32(rows, base + k, 1);
      _mm512_storeu_si512(panel + k / 4 * kPanelRow, _mm512_mask_blend_epi32(live, zero_weight, _mm512_xor_si512(v, flip)));
    }
  }
  for (int64_t g = 0; g < groups; ++g)
    for (int c = 0; c < kQgemmColumns; ++c) scales[g * kQgemmColumns + c] = c < valid ? p.scales[(n0 + c) * groups + g] : 0.0f;
}

// R rows from m0 against one packed tile: y[m0 + r][n0, n0 + valid).
template <int R>
void tile_rows(const QgemmProblem& p, int64_t m0, const uint8_t* panel, const float* scales, int64_t n0, int64_t valid) {
  const int64_t in = p.in, blocks = in / kBlock, per_group = p.group / kBlock, groups = in / p.group;
  const int32_t offset = p.int4 ? 8 : 128;   // what the panel's bytes add to each weight
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
      const uint8_t* rows = panel + b * kBlock / 4 * kPanelRow;
      for (int j = 0; j < kBlock / 4; ++j) {
        const __m512i w = _mm512_loadu_si512(rows + j * kPanelRow);
        for (int r = 0; r < R; ++r) {
          int32_t four;
          __builtin_memcpy(&four, x[r] + b * kBlock + 4 * j, 4);
          sums[r] = _mm512_dpbusd_epi32(sums[r], w, _mm512_set1_epi32(four));
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

}  // namespace

void qgemm_columns(const QgemmProblem& p, int64_t n_begin, int64_t n_end, uint8_t* scratch) {
  uint8_t* panel = scratch;
  auto* scales = reinterpret_cast<float*>(scratch + p.in * kQgemmColumns);
  for (int64_t n0 = n_begin; n0 < n_end; n0 += kQgemmColumns) {
    const int64_t valid = n_end - n0 < kQgemmColumns ? n_end - n0 : kQgemmColumns;
    pack_tile(p, n0, valid, panel, scales);
    int64_t m = 0;
    for (; m + kRows <= p.rows; m += kRows) tile_rows<kRows>(p, m, panel, scales, n0, valid);
    switch (p.rows - m) {
      case 5: tile_rows<5>(p, m, panel, scales, n0, valid); break;
      case 4: tile_rows<4>(p, m, panel, scales, n0, valid); break;
      case 3: tile_rows<3>(p, m, panel, scales, n0, valid); break;
      case 2: tile_rows<2>(p, m, panel, scales, n0, valid); break;
      case 1: tile_rows<1>(p, m, panel, scales, n0, valid); break;
      default: break;
    }
  }
}

}  // namespace colossal::kernels::COLOSSAL_ISA
