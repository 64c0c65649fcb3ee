// Quantized GEMM for prompts (many rows), where the CPU has AVX2: y = x dequant(W)^T + b with the x
// rows quantized as the decoding GEMV's integer path does (qgemv.h: int8 per block of 32 inputs at
// absmax / 127) and W int8 or packed int4 in qgemv.h's layouts. The products are integers summed
// exactly in int32 by vpdpbusd, 64 multiply-adds an instruction against 16 for an fp32 FMA, so a
// prefill no longer expands every weight to floats as the fp32 GEMM's packing did. Without VNNI
// (the avx2 and avx512 sets: qgemm_maddubs_isa.cpp) AVX2's byte multiply takes the same panels, x
// split in two (qgemm_split_rows) so that its int16 pair sums never saturate: the same exact sums.
//
// Layout of the work (the GEMM's own, not the GEMV's): each thread takes whole tiles of 16 output
// columns. A tile's weights are a panel of 64-byte rows as unsigned bytes: for int8, each row holds 4
// consecutive inputs of the 16 columns (int8 + 128; column c's 4 bytes at 4c); for int4, each row holds
// 4 stored bytes of each column (int4's nibbles, value + 8), whose low nibbles are inputs j..j+3 of a
// block and high nibbles inputs j+16..j+19 (qgemv.h's layout), so one row is two rows of products
// after a mask and a shift. The tile's scales per group sit beside it as [group][16]. Rows of x, 6 at
// a time (the last pass up to 8), meet the panel: each panel row is loaded once for the rows, each x
// row's 4 bytes are broadcast, and one vpdpbusd adds 4 products to each of 16 int32 lanes; over panels
// packed at load, each broadcast serves two neighbouring tiles. A block's sums start at minus the
// offset times the block's x sum, so after each block of 32 inputs they are exact (int32); they turn
// to float and take the block's x scale; after each group, the weights' scale. Every output's
// operations are the same whatever the row count, the tile of rows and the thread split, so a row's
// bits do not depend on its batch; and since every lane is one output, a scalar loop doing the same
// operations (qgemm_reference_columns) gives the same bits.
//
// The panels are either built per call, one tile at a time (qgemm_int8/int4: weights in qgemv.h's
// row layout, as checkpoints hold them), or once at load (qgemm_pack), which an inference process
// does on machines with the GEMM: then the per-call packing is gone and the same kernel serves a
// decoding step's few rows, where packing each call would cost more than it saves.
#pragma once
#include <cstdint>

namespace colossal::kernels {

// Whether this machine's kernels have the quantized GEMM (every set but baseline), and the layer is whole
// blocks of 32 inputs in groups of whole blocks (the GEMV's integer path).
bool qgemm_available(int64_t in, int64_t group);

// x [rows, in], bias [out] or null, y [rows, out]; scales [out, in / group]. Requires qgemm_available.
void qgemm_int8(const float* x, int64_t rows, int64_t in, const int8_t* q, const float* scales, int64_t group,
                const float* bias, float* y, int64_t out);
void qgemm_int4(const float* x, int64_t rows, int64_t in, const uint8_t* q, const float* scales, int64_t group,
                const float* bias, float* y, int64_t out);

// Weights packed once (qgemm.h's panels, every tile whole: columns past `out` are zero weights with
// zero scales). Sizes of the two arrays, the packing from qgemv.h's row layout and back (exact), and
// the GEMM over them, which any kernel set runs (the baseline set through the scalar loop, slowly: a
// process packs only where qgemm_available).
int64_t qgemm_packed_bytes(int64_t in, int64_t out, bool int4);
int64_t qgemm_packed_scales(int64_t in, int64_t out, int64_t group);
void qgemm_pack(const void* q, const float* scales, bool int4, int64_t group, int64_t in, int64_t out, uint8_t* panels,
                float* panel_scales);
void qgemm_unpack(const uint8_t* panels, const float* panel_scales, bool int4, int64_t group, int64_t in, int64_t out, void* q,
                  float* scales);
// Rows `ids` [n] of the packed weight, dequantized into rows [n, in] (an embedding's lookup).
void qgemm_packed_rows(const uint8_t* panels, const float* panel_scales, bool int4, int64_t group, int64_t in, const int64_t* ids,
                       int64_t n, float* rows);
void qgemm_packed(const float* x, int64_t rows, int64_t in, const uint8_t* panels, const float* panel_scales, bool int4, int64_t group,
                  const float* bias, float* y, int64_t out);

// W8A8 (SmoothQuant's prompts) over int8 weights packed once with a scale per output (group = in): each
// x row (divided by `divisor` [in] first, where not null) quantized to int8 at its absmax / 127, summed
// against the weights over all of `in` in int32, then y = (sum * x scale) * w scale (+ bias), each
// operation rounded as ATen's path computes it (x / s, amax, round, clamp, at::_int_mm, the two
// multiplies, the bias' add): the same bits. `in` a multiple of 32; any kernel set (the scalar loop
// in the baseline set). The amx set keeps each 16 x 16 tile's sums in its tiles over all of `in`, the case its
// tiles suit (no block scales to apply between them).
void qgemm_w8a8(const float* x, const float* divisor, int64_t rows, int64_t in, const uint8_t* panels, const float* panel_scales,
                const float* bias, float* y, int64_t out);

// What a kernel set's copy computes: columns [n_begin, n_end) (multiples of 16, or `out` at the end)
// of y for all rows, from quantized x rows xq [rows, in] with per block scales xs and integer sums
// xsum [rows, in / 32]. `scratch` is qgemm_scratch_bytes(in, group) bytes of the calling thread's own:
// with `panels` null, the tiles are packed per call from `q` into it, otherwise they are read there;
// the amx set also keeps its tiles' sums there (and int4's panel spread to bytes).
struct QgemmProblem {
  const int8_t* xq;
  const float* xs;
  const int32_t* xsum;
  int64_t rows, in;
  const void* q;   // int8 [out][in], or int4 [out][in / 2] (qgemv.h)
  bool int4;
  const float* scales;
  int64_t group;
  const float* bias;
  float* y;
  int64_t out;
  const uint8_t* panels = nullptr;        // packed once (qgemm_pack), or null
  const float* panel_scales = nullptr;
  // W8A8 (qgemm_w8a8): xs and xsum hold one value a row, the sums run over all of `in`, and
  // y = (sum * xs) * scale (+ bias). int8 panels with one group only.
  bool per_row = false;
  // int8 panels: xq split by qgemm_split_rows, which the sets that ask for it (IsaKernels::qgemm_split_x)
  // read instead of xq; others never read it.
  const int8_t* split = nullptr;
  // A decoding step's rows (at most kQgemmStepRows) as qgemm_step_rows lays them out, which the sets that
  // ask for it (IsaKernels::qgemm_step_rows) read over panels packed at load; null: xq, xs and xsum.
  const int8_t* step_x = nullptr;
  const int32_t* step_start = nullptr;
  const float* step_xs = nullptr;
};
// A decoding step's x rows for the VNNI loop over two tiles at a time (qgemm_isa.cpp): xq [rows, in] as
// step_x [in / 32][rows][32], and per [in / 32][rows] where a block's integer sums start, minus the
// panels' offset (int8: 128, int4: 8) times its x sum (step_start), and its scale (step_xs). With one
// pointer for all the rows, the loop keeps its general registers; the caller lays them out once per
// product, not once per piece of its columns.
constexpr int64_t kQgemmStepRows = 8;
// Where a block's integer sums start over panels: minus the panels' offset (int8: 128, int4: 8) times the
// block's x sum, so that the products of the panels' unsigned bytes bring them to the exact sums.
inline int32_t qgemm_block_start(bool int4, int32_t xsum) { return -(int4 ? 8 : 128) * xsum; }
void qgemm_step_rows(const int8_t* xq, const float* xs, const int32_t* xsum, int64_t rows, int64_t in, bool int4, int8_t* step_x,
                     int32_t* step_start, float* step_xs);
// xq [rows, in] as [rows][2][in]: each row's a, then its b, with x = 16 a + b, b = ((x + 8) mod 16) - 8
// in [-8, 7] and a in [-8, 8] (x in [-127, 127]). Sets whose byte multiply saturates a pair of
// products at int16 (AVX2's vpmaddubsw) multiply the panels' unsigned bytes by a and b: small enough
// for a whole block's products to sum in int16 (qgemm_maddubs_isa.cpp).
void qgemm_split_rows(const int8_t* xq, int64_t rows, int64_t in, int8_t* split);
constexpr int64_t kQgemmColumns = 16;   // output columns a tile (one 512-bit vector of int32 sums)
constexpr int64_t kQgemmPanelRow = 64;  // bytes of a panel row
constexpr int64_t kQgemmAmxSums = 2 * 16 * kQgemmColumns * 4;   // two blocks' sums of 16 rows
inline int64_t qgemm_amx_scratch_bytes(int64_t in) { return kQgemmAmxSums + in * kQgemmColumns + 64; }
inline int64_t qgemm_scratch_bytes(int64_t in, int64_t group) {
  return in * kQgemmColumns + in / group * kQgemmColumns * 4 + 64 + qgemm_amx_scratch_bytes(in);
}
// The calling thread's scratch of qgemm_scratch_bytes(in, group) bytes (thread_scratch.h: kept across
// calls, on a cache line), for qgemm_columns.
uint8_t* qgemm_thread_scratch(int64_t in, int64_t group);
// The same operations as a kernel set's copy, one lane at a time: the same bits, on any machine.
void qgemm_reference_columns(const QgemmProblem& p, int64_t n_begin, int64_t n_end);

}  // namespace colossal::kernels
