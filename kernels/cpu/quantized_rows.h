// x rows quantized for the quantized kernels' integer paths (qgemv.h, qgemm.h): int8 per block of 32
// inputs at absmax / 127, with what each kernel needs beside them. Shared by the decoding GEMV and the
// prompt GEMM, so both round x alike.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/cpu/isa_kernels.h"

namespace colossal::kernels {

struct QuantizedRows {
  std::vector<int8_t> q;     // [rows, in]
  std::vector<uint8_t> a;    // |q|, the int8 GEMV's unsigned operand
  std::vector<float> s, c;   // per block: the scale, and int4's offset 8 * sum * scale
  std::vector<int32_t> sum;  // per block: the integer sum (the prompt GEMM's offsets)
  std::vector<int8_t> split; // [rows][2][in], for int8 panels where the set asks (qgemm.h's qgemm_split_rows)
  // a decoding step's rows for panels, where the set asks (qgemm.h's qgemm_step_rows)
  std::vector<int8_t> step_x;
  std::vector<int32_t> step_start;
  std::vector<float> step_xs;
  bool has_split = false, has_step = false;   // whether the last call filled split, and the step's layout
};

// What the rows are quantized for: the decoding GEMV, or the GEMM over int8 or int4 panels (qgemm.h).
enum class RowsFor : uint8_t { gemv, int8_panels, int4_panels };

// Quantizes x [rows, in] (in a multiple of 32) with `k`'s kernel into buffers the calling thread keeps
// until its next call. Rows for int8 panels are also split where `k` multiplies them split
// (IsaKernels::qgemm_split_x; the GEMV and int4 panels never read it), and a decoding step's rows for
// panels laid out as `k` reads them (IsaKernels::qgemm_step_rows).
const QuantizedRows& quantize_rows(const IsaKernels& k, const float* x, int64_t rows, int64_t in, RowsFor use = RowsFor::gemv);

// The problem's fields beside xq, xs and xsum for the rows quantize_rows last gave: the split and the
// step's layout, where that call made them.
void set_problem_rows(QgemmProblem& p, const QuantizedRows& r);

}  // namespace colossal::kernels
