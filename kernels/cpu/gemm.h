// Dense fp32 GEMM for the training step's linear layers on CPU, in the three forms a linear layer needs:
//   forward   Y  = X W^T + b     (A = X [M, in], B = W read transposed)
//   input     dX = dY W          (A = dY [M, out], B = W)
//   weight    dW (+)= dY^T X     (A = dY read down its columns, B = X; can sum into .grad)
// Each operand is described by two strides, so no caller transposes anything. A with contiguous
// rows (the activations in the forward, dY in the input gradient: the large operand) is read where
// it lies, one broadcast per element, where BLAS packs it on every call (at GPT-2's small widths a
// tenth of MKL's time); a strided A (dY down its columns) is packed per register tile. B is packed
// per thread in blocks of up to kGemmDepthBlock x kGemmPanel that stay in L2 while the thread's rows
// sweep them.
//
// Every output is the same fixed sequence of multiply-adds whatever the thread count or the rows a
// thread gets, so results do not depend on threads. Columns must be a multiple of kGemmColumnMultiple
// (every instruction set's vector width); callers fall back to BLAS otherwise.
#pragma once
#include <cstdint>

namespace colossal::kernels {

inline constexpr int64_t kGemmColumnMultiple = 16;
// The most reduction steps in one pass over a B block (the AVX-512 copy's single pass over a depth of up
// to 768); each copy says how many it takes for a given product (isa_kernels.h's gemm_pass_depth).
inline constexpr int64_t kGemmDepthBlock = 768;
inline constexpr int64_t kGemmPanel = 256;        // columns per B block: its 256-768 x 256 floats stay in L2
inline constexpr int64_t kGemmTileRowsMax = 8;    // the most rows any set's tile has
// A with a strided depth axis (the weight gradient's dY, read down its columns) is packed for a whole
// depth block of a thread's rows at once, in stretches of at most this many rows (an LM head's gradient
// has tens of thousands).
inline constexpr int64_t kGemmPackedRowsMax = 4096;
// Per-thread scratch for `rows` rows of C in passes of `pass_depth` steps: one packed B block and, for a
// strided A, its packing.
inline constexpr int64_t gemm_scratch_floats(int64_t rows, int64_t pass_depth, bool strided_a) {
  return pass_depth * (kGemmPanel + (strided_a ? (rows < kGemmPackedRowsMax ? rows : kGemmPackedRowsMax) + kGemmTileRowsMax : 0));
}

// B(r, n) read from a quantized linear layer's weight instead of floats: W[n][r] of qgemv.h's layouts
// (int8, or packed int4 in blocks of 32, a scale per `group` inputs), dequantized as B is packed, so the
// prefill of a quantized model never holds an fp32 copy of a weight (the forward form: b_depth 1, b_col
// = depth).
struct GemmQuantizedB {
  const void* q;
  const float* scales;   // [cols, depth / group]
  int64_t group;
  bool int4;
};

struct GemmProblem {
  int64_t rows, cols, depth;   // C is [rows, cols]; each entry sums `depth` products
  const float* a;              // A(m, r) = a[m * a_row + r * a_depth]
  int64_t a_row, a_depth;
  const float* b;              // B(r, n) = b[r * b_depth + n * b_col]
  int64_t b_depth, b_col;
  float* c;                    // C(m, n) = c[m * ldc + n]
  int64_t ldc;
  const float* bias = nullptr;   // [cols], added once; or null
  bool accumulate = false;       // C += A B instead of C = A B
  const GemmQuantizedB* quantized_b = nullptr;   // set: B comes from it and `b` is unused
};

// Runs over the OpenMP threads: C's rows split between them, or its columns where the rows are few.
void gemm(const GemmProblem& p);


}  // namespace colossal::kernels
