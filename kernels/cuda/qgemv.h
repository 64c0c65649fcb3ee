// Weight-only quantized decoding GEMV on a CUDA device: y = x dequant(W)^T + b for the few rows of one
// decoding step (1 to 16), with W in the checkpoint's own layouts (kernels/cpu/qgemv.h: int8 [out, in],
// or int4 bytes [out, in / 2] in blocks of 32 inputs, one fp32 scale per group of inputs).
//
// It is the CPU integer path's arithmetic (qgemv.h): x is quantized to int8 per block of 32 inputs
// (absmax / 127, nearest even: the CPU's bits), each block's 32 products are summed exactly in int32 by
// dp4a, and only then scaled by x's block scale and the weight's group scale. So the GPU and the CPU sum
// the same integers; only the float sum over the blocks runs in another order. The weights are read
// once for all rows, 16 bytes a load, and never expanded in memory: a step reads a quarter (int8) or an
// eighth (int4) of fp32's bytes.
//
// Declarations only, no CUDA header (kernels/cuda/built.h says whether nvcc built the definitions).
#pragma once
#include <cstdint>

namespace colossal::kernels {

constexpr int64_t kCudaQgemvMaxRows = 16;

// Whether the kernel takes a layer: `in` and `group` whole blocks of 32 inputs (every int4 layer).
inline bool qgemv_cuda_takes(int64_t in, int64_t group) { return in % 32 == 0 && group % 32 == 0 && in > 0 && group > 0; }

// All pointers in device memory of the current device, each row contiguous (q and xq 16-byte aligned,
// as they are read 16 bytes a load; the rest element by element): x [rows, in]
// fp32, q as above (int8 rows of `in` bytes, int4 rows of in / 2), scales [out, in / group], bias [out] or
// null, y [rows, out]. `xq` [rows, in] int8 and `xs` [rows, in / 32] fp32 are the caller's scratch (x's
// quantized copy). Asynchronous on `stream` (a cudaStream_t); throws std::runtime_error with CUDA's
// message if a launch fails.
void qgemv_cuda(const float* x, int64_t rows, int64_t in, const void* q, bool int4, const float* scales, int64_t group,
                const float* bias, float* y, int64_t out, int8_t* xq, float* xs, void* stream);

// Only x's quantization (the first half of the above), for tests: xq [rows, in], xs [rows, in / 32].
void quantize_rows_q8_cuda(const float* x, int64_t rows, int64_t in, int8_t* xq, float* xs, void* stream);

}  // namespace colossal::kernels
