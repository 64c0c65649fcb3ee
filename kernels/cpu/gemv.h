// Matrix-vector products for decoding: a few rows of activations (one new token per sequence)
// against a weight matrix, y = x W^T + b, with W [out, in] row-major (torch's Linear layout). Decoding
// is bound by reading W, so each weight row is read once per call for all x rows together, the output
// rows are split across the cores (MKL's GEMV leaves one core working while the others spin), and
// the dot products run at the active instruction set's width. Each output is computed by the same
// operations whatever the row count, the thread split or the block it falls in, so a batch of
// sequences decodes exactly as each sequence alone.
#pragma once
#include <cstdint>

namespace colossal::kernels {

// x [rows, in], w [out, in], bias [out] or null, y [rows, out]; all row-major and contiguous.
void gemv(const float* x, int64_t rows, int64_t in, const float* w, const float* bias, float* y, int64_t out);

// The same product with W stored transposed, wt [in, out] row-major: a weight a model views in place
// where the file holds W^T (GPT-2's Conv1D weights, read straight from a checkpoint), so no copy is made
// per call. Each output is one multiply-add chain over the inputs in order, so a row's bits are the
// same alone, in a batch and on any thread count (they differ from gemv's, which sums in lanes).
void gemv_t(const float* x, int64_t rows, int64_t in, const float* wt, const float* bias, float* y, int64_t out);

}  // namespace colossal::kernels
