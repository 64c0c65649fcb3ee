// Weight-only quantized matrix-vector products for decoding: y = x dequant(W)^T + b for a few rows of
// activations (one new token per sequence), where W is stored as small integers with one fp32 scale per
// group of `group` consecutive inputs of an output row. Decoding is bound by reading W, and int8 reads a
// quarter of fp32's bytes, int4 an eighth; the integers are widened to float in registers and multiplied
// there, so the weights are never expanded in memory. As in gemv.h: output rows are split across the
// cores, each weight row is read once for all x rows, and each output is computed by the same operations
// whatever the row count or the thread split (a batch decodes exactly as each sequence alone).
//
// Layouts (row-major by output row, `in` inputs a row):
//   int8  q[out][in]        value = q * scale[o][i / group]
//   int4  q[out][in / 2]    bytes; in blocks of 32 inputs (16 bytes), byte j of a block holds input j in its
//                           low nibble and input j + 16 in its high nibble, each stored as value + 8
//                           (0..15 for -8..7), so one 16-byte load unpacks into four 8-float vectors
//                           with a mask and a shift. `in` and `group` are multiples of 32.
#pragma once
#include <cstdint>

namespace colossal::kernels {

constexpr int64_t kInt4Block = 32;   // inputs per packed int4 block (16 bytes)

// Layers whose width and group are whole blocks of 32 inputs (every int4 layer; int8 ones of such widths)
// take the integer path: each call quantizes the x rows to int8 per block of 32 (scale absmax / 127,
// rounded to nearest even), and every block's products sum exactly in int32 before the scales apply,
// so the result is that of the dequantized x (not x itself) times the dequantized weight. Other int8
// layers widen the weights to floats against x as it is.
constexpr int64_t kQ8Block = 32;
bool qgemv_integer_path(int64_t in, int64_t group);
// The integer path's quantization of x [rows, in] (in a multiple of 32): xq [rows, in], xs [rows, in / 32].
void quantize_rows_q8(const float* x, int64_t rows, int64_t in, int8_t* xq, float* xs);

// x [rows, in], bias [out] or null, y [rows, out]; scales [out, in / group] (group divides in).
void qgemv_int8(const float* x, int64_t rows, int64_t in, const int8_t* q, const float* scales, int64_t group,
                const float* bias, float* y, int64_t out);
void qgemv_int4(const float* x, int64_t rows, int64_t in, const uint8_t* q, const float* scales, int64_t group,
                const float* bias, float* y, int64_t out);

}  // namespace colossal::kernels
