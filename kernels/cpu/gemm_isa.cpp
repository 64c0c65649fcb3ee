// Dense GEMM, one instruction set's copy of the row loop: see gemm.h for the forms and layouts,
// gemm.cpp for threading.
//
// The register tile is kTileRows rows of C by kTileVecs vectors: per step of the reduction it loads
// kTileVecs vectors of B and broadcasts one A element per row, for kTileRows x kTileVecs multiply-adds.
// Sized per set so accumulators and operands fit the registers (AVX2: 6 x 2 = 12 accumulators of
// its 16; AVX-512: 6 x 4 = 24 of its 32). On an AMD EPYC with AVX-512, 8 x 2, 12 x 2, 6 x 4, 8 x 3,
// 4 x 4 and 14 x 2 measured within noise of each other at GPT-2's shapes: its multiply-add units, not
// the loads, are the limit there. An Intel Xeon (two 512-bit multiply-add units and two loads a cycle)
// is limited by the loads instead: 8 x 2 issues 10 loads per 16 multiply-adds, 6 x 4 10 per 24, and
// all fifteen products of a GPT-2 124M step (2 threads, operands as training lays them out) ran
// 1.04-1.07x faster as 6 x 4 than as 8 x 2 (12 x 2 and 14 x 2 1.03-1.05x, 7 x 4 1.03x).
#include <algorithm>
#include <cstring>

#include "kernels/cpu/isa_entry.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/transpose_isa.h"

namespace colossal::kernels::COLOSSAL_ISA {
namespace {

#if defined(__AVX512F__)
constexpr int kTileRows = 6, kTileVecs = 4;
#else
constexpr int kTileRows = 6, kTileVecs = 2;
#endif
constexpr int64_t kWide = kTileVecs * kLanes;   // columns of one full tile
static_assert(kGemmPanel % kWide == 0 && kTileRows <= kGemmTileRowsMax);

// Reduction steps per pass over a packed B block (kDepthBlock x kGemmPanel floats, kept in L2 while the
// thread's rows sweep it; each pass past the first reads and writes C again). AVX-512 CPUs have 1-2 MB of
// L2 per core: on an Intel Xeon (2 MB) 512 steps (a 512 KB block) ran GPT-2 124M's fifteen products
// 1.05x faster than 256 (1.00-1.08x each), and 1024 lost on the weight gradients. AVX2's 256 keeps the
// block in half of a Zen 3's 512 KB. The passes continue each output's multiply-add chain through
// C (adding 0 to it, which only turns a -0 into +0), so the block size does not change a result.
// A reduction of up to kOnePassDepth steps is one pass (not quantized B: its packing's row buffer is
// sized by kDepthBlock): GPT-2 124M's 768-step forwards had run as a 512-step pass and a short 256-step
// one that read and wrote C again; as one pass they ran 1.02-1.18x faster on the Intel Xeon (the
// 50304-column LM head 1.07-1.11x, which took it past MKL's), and the 768-step input gradients
// 1.04-1.05x.
#if defined(__AVX512F__)
constexpr int64_t kDepthBlock = 512, kOnePassDepth = 768;
#else
constexpr int64_t kDepthBlock = 256, kOnePassDepth = 256;
#endif
static_assert(kDepthBlock <= kOnePassDepth && kOnePassDepth <= kGemmDepthBlock && kDepthBlock % 32 == 0);

// C[R rows][V vectors] starting at c: init (bias or 0, or C's own values when load_c) plus the sum
// over `depth` steps of A(i, r) * B(r, :). On AVX-512 not inlined: each call runs `depth` steps (a
// full block's kDepthBlock), and with all the 6 x 4 set's shapes inlined into gemm_rows (24 KB of
// code) the products ran 3% slower on an Intel Xeon than with the tiles as calls; AVX2's ran 1% slower
// as calls.
#if defined(__AVX512F__)
#define COLOSSAL_GEMM_TILE __attribute__((noinline))
#else
#define COLOSSAL_GEMM_TILE COLOSSAL_INLINE
#endif
template <int R, int V>
COLOSSAL_GEMM_TILE void tile(const float* __restrict a, int64_t a_row, int64_t a_depth, const float* __restrict b,
                          int64_t ldb, int64_t depth, float* __restrict c, int64_t ldc, bool load_c,
                          const float* __restrict bias) {
  vf acc[R][V];
  for (int j = 0; j < V; ++j) {
    const vf init = bias ? load_u(bias + j * kLanes) : vf{};
    for (int i = 0; i < R; ++i) acc[i][j] = load_c ? load_u(c + i * ldc + j * kLanes) + init : init;
  }
  for (int64_t r = 0; r < depth; ++r) {
    vf bv[V];
    for (int j = 0; j < V; ++j) bv[j] = load_u(b + r * ldb + j * kLanes);
    const float* ar = a + r * a_depth;
    for (int i = 0; i < R; ++i) {
      const vf x = splat(ar[i * a_row]);
      for (int j = 0; j < V; ++j) acc[i][j] += x * bv[j];
    }
  }
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < V; ++j) store_u(c + i * ldc + j * kLanes, acc[i][j]);
}

// The same for `rows` < R rows (the last rows of a thread's range).
template <int V, int R = kTileRows - 1>
COLOSSAL_INLINE void tile_rows(int rows, const float* a, int64_t a_row, int64_t a_depth, const float* b, int64_t ldb,
                               int64_t depth, float* c, int64_t ldc, bool load_c, const float* bias) {
  if constexpr (R >= 1) {
    if (rows == R) return tile<R, V>(a, a_row, a_depth, b, ldb, depth, c, ldc, load_c, bias);
    tile_rows<V, R - 1>(rows, a, a_row, a_depth, b, ldb, depth, c, ldc, load_c, bias);
  }
}

template <int V>
COLOSSAL_INLINE void any_tile(int64_t rows, const float* a, int64_t a_row, int64_t a_depth, const float* b,
                              int64_t ldb, int64_t depth, float* c, int64_t ldc, bool load_c, const float* bias) {
  if (rows == kTileRows) tile<kTileRows, V>(a, a_row, a_depth, b, ldb, depth, c, ldc, load_c, bias);
  else tile_rows<V>(static_cast<int>(rows), a, a_row, a_depth, b, ldb, depth, c, ldc, load_c, bias);
}

// A tile over a packed strip of `vecs` vectors (kTileVecs, or fewer for the last strip of a panel).
template <int V = kTileVecs>
COLOSSAL_INLINE void strip_tile(int64_t vecs, int64_t rows, const float* a, int64_t a_row, int64_t a_depth, const float* b,
                                int64_t depth, float* c, int64_t ldc, bool load_c, const float* bias) {
  if constexpr (V >= 1) {
    if (vecs == V) return any_tile<V>(rows, a, a_row, a_depth, b, V * kLanes, depth, c, ldc, load_c, bias);
    strip_tile<V - 1>(vecs, rows, a, a_row, a_depth, b, depth, c, ldc, load_c, bias);
  }
}

// B(r0 + r, n0 + c) for r < depth, c < width, packed as consecutive strips of kWide columns (the
// last of a panel as many whole vectors as are left), each strip [depth][its width]: the tile then
// reads B as one sequential stream whatever B's strides, so wide rows (a new page every step) and the
// forward's transposed weight cost the same as contiguous ones. Each thread packs the block it sweeps.
// The same from a quantized weight: each column's inputs [r0, r0 + depth) dequantized into a row (a
// contiguous read of the integers), then laid into the strip. Never inlined: inlined into the AVX2
// copy's gemm_rows (whose tiles are inlined there too), its 16 KB row buffer and loops made every
// float product 1.11-1.12x slower on an Intel Xeon (GPT-2 124M's and gpt-tiny's fifteen products, one
// process, against the same code with this one attribute), although none of them runs it.
__attribute__((noinline)) void pack_quantized_b(const GemmProblem& p, int64_t r0, int64_t depth, int64_t n0, int64_t width, float* __restrict dst) {
  const GemmQuantizedB& qb = *p.quantized_b;
  const int64_t in = p.b_col, groups = in / qb.group;
  alignas(64) float rows[kWide][kDepthBlock];   // the strip's columns, each dequantized as a row
  for (int64_t c = 0; c < width;) {
    const int64_t ws = std::min(kWide, width - c);
    for (int64_t l = 0; l < ws; ++l) {
      const int64_t n = n0 + c + l;
      const float* scale = qb.scales + n * groups;
      float* row = rows[l];
      // Group by group (r0 and depth are multiples of 32, and groups of 32 inputs or more, so a group's
      // part inside [r0, r0 + depth) is whole blocks), each a loop the compiler vectorises.
      for (int64_t i = r0; i < r0 + depth;) {
        const int64_t g = i / qb.group, end = std::min(r0 + depth, (g + 1) * qb.group);
        const float s = scale[g];
        if (qb.int4) {
          const uint8_t* q = static_cast<const uint8_t*>(qb.q) + n * (in / 2);
          for (; i < end; i += 32) {
            const uint8_t* block = q + i / 32 * 16;
            float* out = row + (i - r0);
            for (int j = 0; j < 16; ++j) out[j] = static_cast<float>((block[j] & 15) - 8) * s;
            for (int j = 0; j < 16; ++j) out[16 + j] = static_cast<float>((block[j] >> 4) - 8) * s;
          }
        } else {
          const int8_t* q = static_cast<const int8_t*>(qb.q) + n * in;
          for (; i < end; ++i) row[i - r0] = static_cast<float>(q[i]) * s;
        }
      }
    }
    for (int64_t r = 0; r < depth; ++r)
      for (int64_t l = 0; l < ws; ++l) dst[r * ws + l] = rows[l][r];
    dst += depth * ws;
    c += ws;
  }
}

void pack_b(const GemmProblem& p, int64_t r0, int64_t depth, int64_t n0, int64_t width, float* __restrict dst) {
  if (p.quantized_b) return pack_quantized_b(p, r0, depth, n0, width, dst);
  for (int64_t c = 0; c < width;) {
    const int64_t ws = std::min(kWide, width - c);
    const float* src = p.b + r0 * p.b_depth + (n0 + c) * p.b_col;
    if (p.b_col == 1) {
      // Row pieces of whole vectors, copied in registers: as a loop over floats GCC made each a memmove
      // call, 2% of a GPT-2 124M training step on a Zen 3, and a loop over the piece's `ws / kLanes`
      // vectors it turns into one as well. A fixed count of kTileVecs, the last ones skipped in a
      // narrower strip, it unrolls.
      for (int64_t r = 0; r < depth; ++r)
        for (int j = 0; j < kTileVecs; ++j)
          if (j * kLanes < ws) store_u(dst + r * ws + j * kLanes, load_u(src + r * p.b_depth + j * kLanes));
    } else {
      int64_t r = 0;
#if defined(__AVX2__)
      if (p.b_depth == 1)   // B is a row-major matrix read transposed (the forward's weight): 8 x 8 blocks
        for (; r + 8 <= depth; r += 8)
          for (int64_t l = 0; l < ws; l += 8) transpose_8x8(src + l * p.b_col + r, p.b_col, dst + r * ws + l, ws);
#endif
      for (; r < depth; ++r)
        for (int64_t l = 0; l < ws; ++l) dst[r * ws + l] = src[r * p.b_depth + l * p.b_col];
    }
    dst += depth * ws;
    c += ws;
  }
}

// A(m, r) for the rows [m_begin, m_begin + m_rows) and steps [r0, r0 + depth), A's depth axis strided
// (the weight gradient's dY, read down its columns), packed per register tile as [depth][kTileRows]
// (tile t at dst + t * depth * kTileRows; a last tile of fewer rows leaves its other slots unwritten,
// and the tile reads only its rows). Eight steps at a time across all tiles: each of the eight rows
// of dY is read as one contiguous run, and each tile's destination takes 8 x kTileRows consecutive
// floats. Step by step across all tiles (one row of dY at a time), every tile's slot lay depth x
// kTileRows floats from the last, the same offset within a 4 KB page for a depth block of 256: on an
// Intel Xeon the packing then took a quarter of the weight gradient's time (tiny GPT shapes), and the
// product ran 1.1-1.4x faster this way.
void pack_strided_a(const GemmProblem& p, int64_t m_begin, int64_t m_rows, int64_t r0, int64_t depth, float* __restrict dst) {
  constexpr int64_t kSteps = 8;
  for (int64_t rb = 0; rb < depth; rb += kSteps) {
    const int64_t re = std::min(depth, rb + kSteps);
    for (int64_t t = 0; t * kTileRows < m_rows; ++t) {
      float* tile_dst = dst + t * depth * kTileRows;
      const int64_t rows = std::min<int64_t>(kTileRows, m_rows - t * kTileRows);
      const float* a = p.a + (m_begin + t * kTileRows) * p.a_row + r0 * p.a_depth;
      if (rows == kTileRows && p.a_row == 1)   // the tile's rows are adjacent in each step: one copy
        for (int64_t r = rb; r < re; ++r) std::memcpy(tile_dst + r * kTileRows, a + r * p.a_depth, kTileRows * sizeof(float));
      else
        for (int64_t r = rb; r < re; ++r)
          for (int64_t i = 0; i < rows; ++i) tile_dst[r * kTileRows + i] = a[r * p.a_depth + i * p.a_row];
    }
  }
}

}  // namespace

const int gemm_tile_rows = kTileRows;

int64_t gemm_pass_depth(const GemmProblem& p) { return !p.quantized_b && p.depth <= kOnePassDepth ? p.depth : kDepthBlock; }

void gemm_rows(const GemmProblem& p, int64_t m_begin, int64_t m_end, int64_t n_begin, int64_t n_end, float* scratch) {
  const bool pack_a = p.a_depth != 1;
  if (pack_a && m_end - m_begin > kGemmPackedRowsMax) {
    // Rows in stretches whose packed A fits the scratch (an LM head's gradient: tens of thousands of
    // rows), each stretch packing B again: a few MB of copies against its hundreds of MFLOP. The same
    // operations per output, so the same bits.
    constexpr int64_t stretch = kGemmPackedRowsMax / kTileRows * kTileRows;
    for (int64_t m = m_begin; m < m_end; m += stretch) gemm_rows(p, m, std::min(m + stretch, m_end), n_begin, n_end, scratch);
    return;
  }
  float* b_packed = scratch;
  const int64_t block = gemm_pass_depth(p);
  float* a_packed = scratch + block * kGemmPanel;
  // A whose depth axis is strided (the weight gradient reads dY down its columns) is packed for every
  // tile of these rows once per depth block (pack_strided_a) and kept for every panel of B; A with
  // contiguous rows is read where it lies. Packed tile by tile inside the panel loop instead, each tile
  // re-read A's strided columns once per panel, and the weight gradient ran at 0.75 of the rate of the
  // same product with dY transposed beforehand (Zen 3, GPT-2 124M's layers).
  const int64_t m_rows = m_end - m_begin;
  for (int64_t r0 = 0; r0 < p.depth; r0 += block) {
    const int64_t depth = std::min(block, p.depth - r0);
    const bool load_c = r0 > 0 || p.accumulate;
    const float* bias = r0 == 0 ? p.bias : nullptr;
    if (pack_a) pack_strided_a(p, m_begin, m_rows, r0, depth, a_packed);
    for (int64_t n0 = n_begin; n0 < n_end; n0 += kGemmPanel) {
      const int64_t width = std::min(kGemmPanel, n_end - n0);
      pack_b(p, r0, depth, n0, width, b_packed);
      for (int64_t m = m_begin; m < m_end; m += kTileRows) {
        const int64_t rows = std::min<int64_t>(kTileRows, m_end - m);
        const float* a = p.a + m * p.a_row + r0 * p.a_depth;
        int64_t a_row = p.a_row, a_depth = p.a_depth;
        if (pack_a) a = a_packed + (m - m_begin) / kTileRows * depth * kTileRows, a_row = 1, a_depth = kTileRows;
        float* c = p.c + m * p.ldc + n0;
        const float* b = b_packed;
        for (int64_t n = 0; n < width;) {
          const float* bn = bias ? bias + n0 + n : nullptr;
          const int64_t ws = std::min(kWide, width - n);   // a whole number of vectors (gemm.h)
          strip_tile(ws / kLanes, rows, a, a_row, a_depth, b, depth, c + n, p.ldc, load_c, bn);
          b += depth * ws, n += ws;
        }
      }
    }
  }
}

}  // namespace colossal::kernels::COLOSSAL_ISA
