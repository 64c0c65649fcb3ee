// Quantized GEMM for prompts (many rows), where the CPU has VNNI: y = x dequant(W)^T + b with the x
// rows quantized as the decoding GEMV's integer path does (qgemv.h: int8 per block of 32 inputs at
// absmax / 127) and W int8 or packed int4 in qgemv.h's layouts. The products are integers summed
// exactly in int32 by vpdpbusd, 64 multiply-adds an instruction against 16 for an fp32 FMA, so a
// prefill no longer expands every weight to floats as the fp32 GEMM's packing did.
//
// Layout of the work (the GEMM's own, not the GEMV's): each thread takes whole tiles of 16 output
// columns; a tile's weights are packed once per call into a panel of 64-byte rows, each holding 4
// consecutive inputs of the 16 columns as unsigned bytes (int8 + 128, or int4's stored nibble, which
// is value + 8), with the tile's scales per group beside it. Then rows of x, 6 at a time, meet the
// panel: each 64-byte panel row is loaded once for the 6, each x row's 4 bytes are broadcast, and one
// vpdpbusd adds 4 products to each of 16 int32 lanes. After each block of 32 inputs an x row's sums
// lose the offset times the block's x sum (exact, in int32), turn to float and take the block's x
// scale; after each group, the weights' scale. Every output's operations are the same whatever the
// row count, the tile of rows and the thread split, so a row's bits do not depend on its batch.
#pragma once
#include <cstdint>

namespace colossal::kernels {

// Whether this machine's kernels have the quantized GEMM (the avx512vnni set), and the layer is whole
// blocks of 32 inputs in groups of whole blocks (the GEMV's integer path).
bool qgemm_available(int64_t in, int64_t group);

// x [rows, in], bias [out] or null, y [rows, out]; scales [out, in / group]. Requires qgemm_available.
void qgemm_int8(const float* x, int64_t rows, int64_t in, const int8_t* q, const float* scales, int64_t group,
                const float* bias, float* y, int64_t out);
void qgemm_int4(const float* x, int64_t rows, int64_t in, const uint8_t* q, const float* scales, int64_t group,
                const float* bias, float* y, int64_t out);

// What a kernel set's copy computes: columns [n_begin, n_end) (multiples of 16, or `out` at the end)
// of y for all rows, from quantized x rows xq [rows, in] with per block scales xs and integer sums
// xsum [rows, in / 32]. scratch: qgemm_scratch_bytes(in, group) bytes of the calling thread's own.
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
};
constexpr int64_t kQgemmColumns = 16;   // output columns a tile (one 512-bit vector of int32 sums)
inline int64_t qgemm_scratch_bytes(int64_t in, int64_t group) { return in * kQgemmColumns + in / group * kQgemmColumns * 4 + 64; }

}  // namespace colossal::kernels
