// Fused softmax cross entropy over rows of logits, in place: each row of logits is replaced by its
// own gradient, (softmax(row) - onehot(target)) * grad_scale, while the row's loss is written out.
// One read and one write of the logits instead of log_softmax's output, its backward and NLL's
// zero-filled gradient: the classifier of llm.c, over raw pointers.
#pragma once
#include <cstdint>

namespace colossal::kernels {

// logits: [rows, cols] row-major float; targets: [rows] (a negative target ignores the row: zero
// loss, zero gradient); losses: [rows] out. Parallel over rows (OpenMP), vectorised inside a row.
void softmax_cross_entropy_inplace(float* logits, const int64_t* targets, float* losses, int64_t rows, int64_t cols,
                                   float grad_scale);

}  // namespace colossal::kernels
