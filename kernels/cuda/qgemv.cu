// Weight-only quantized decoding GEMV on CUDA: see qgemv.h.
#include "kernels/cuda/qgemv.h"

#include <cuda_runtime.h>

#include <stdexcept>
#include <utility>
#include <string>

namespace colossal::kernels {
namespace {

constexpr int kBlock = 32;        // inputs a block: one x scale, one dp4a sum of 32 products
constexpr int kOuts = 4;          // output rows a thread block computes; each weight load serves every x row
constexpr int kWarps = 4;         // warps of a thread block, each summing every fourth stride of blocks
constexpr int kQuantWarps = 8;    // quantize_rows: a warp per block of 32 inputs

void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// x block of 32 -> int8 at absmax / 127, rounded to nearest even: the CPU's quantize_rows_q8 operation
// for operation (the max is exact, the division and the product each rounded once).
__global__ void __launch_bounds__(kQuantWarps * 32) quantize_blocks(const float* __restrict__ x, int64_t n_blocks, int8_t* __restrict__ xq,
                                                                    float* __restrict__ xs) {
  const int64_t b = int64_t{blockIdx.x} * kQuantWarps + threadIdx.x / 32;
  if (b >= n_blocks) return;
  const int lane = threadIdx.x % 32;
  const float v = x[b * kBlock + lane];
  float top = fabsf(v);
#pragma unroll
  for (int d = 16; d > 0; d /= 2) top = fmaxf(top, __shfl_xor_sync(0xFFFFFFFFu, top, d));
  const float inv = top > 0.0f ? __fdiv_rn(127.0f, top) : 0.0f;
  const int q = __float2int_rn(__fmul_rn(v, inv));
  xq[b * kBlock + lane] = static_cast<int8_t>(q < -127 ? -127 : q > 127 ? 127 : q);
  if (lane == 0) xs[b] = __fdiv_rn(top, 127.0f);
}

// The sum of 32 products of one block, exactly: x's 32 int8 (two 16-byte vectors) against the weight's
// 32 values, int8 as two vectors, or int4 as one vector of bytes whose low nibbles are inputs 0..15 and
// high nibbles 16..31, each value + 8.
__device__ __forceinline__ int block_dot(const uint4& xa, const uint4& xb, const uint4& wa, const uint4& wb) {
  int d = __dp4a(static_cast<int>(xa.x), static_cast<int>(wa.x), 0);
  d = __dp4a(static_cast<int>(xa.y), static_cast<int>(wa.y), d);
  d = __dp4a(static_cast<int>(xa.z), static_cast<int>(wa.z), d);
  d = __dp4a(static_cast<int>(xa.w), static_cast<int>(wa.w), d);
  d = __dp4a(static_cast<int>(xb.x), static_cast<int>(wb.x), d);
  d = __dp4a(static_cast<int>(xb.y), static_cast<int>(wb.y), d);
  d = __dp4a(static_cast<int>(xb.z), static_cast<int>(wb.z), d);
  return __dp4a(static_cast<int>(xb.w), static_cast<int>(wb.w), d);
}

__device__ __forceinline__ unsigned nibbles(unsigned w, int shift) { return __vsub4((w >> shift) & 0x0F0F0F0Fu, 0x08080808u); }

// One thread block: outputs [o0, o0 + kOuts) for all R rows. Warp w sums blocks w*32 + lane, then every
// kWarps*32-th; lanes and then warps are summed in a fixed order, so a row's result never depends on R.
template <int R, bool Int4>
__global__ void __launch_bounds__(kWarps * 32) qgemv_rows(const int8_t* __restrict__ xq, const float* __restrict__ xs, int64_t in,
                                                          const uint8_t* __restrict__ q, const float* __restrict__ scales, int64_t group,
                                                          const float* __restrict__ bias, float* __restrict__ y, int64_t out) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t o0 = int64_t{blockIdx.x} * kOuts, n_blocks = in / kBlock, row_bytes = Int4 ? in / 2 : in, groups = in / group;
  const uint8_t* wrow[kOuts];
  const float* srow[kOuts];
#pragma unroll
  for (int j = 0; j < kOuts; ++j) {
    const int64_t o = o0 + j < out ? o0 + j : out - 1;   // past the end: the last row again, its result dropped
    wrow[j] = q + o * row_bytes;
    srow[j] = scales + o * groups;
  }
  float acc[R][kOuts];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int j = 0; j < kOuts; ++j) acc[r][j] = 0.0f;

  for (int64_t b = int64_t{warp} * 32 + lane; b < n_blocks; b += kWarps * 32) {
    uint4 wa[kOuts], wb[kOuts];
    float ws[kOuts];
#pragma unroll
    for (int j = 0; j < kOuts; ++j) {
      // weights are read once: streaming loads, so they do not push x out of the caches
      if constexpr (Int4) {
        const uint4 w = __ldcs(reinterpret_cast<const uint4*>(wrow[j] + b * 16));
        wa[j] = make_uint4(nibbles(w.x, 0), nibbles(w.y, 0), nibbles(w.z, 0), nibbles(w.w, 0));
        wb[j] = make_uint4(nibbles(w.x, 4), nibbles(w.y, 4), nibbles(w.z, 4), nibbles(w.w, 4));
      } else {
        wa[j] = __ldcs(reinterpret_cast<const uint4*>(wrow[j] + b * 32));
        wb[j] = __ldcs(reinterpret_cast<const uint4*>(wrow[j] + b * 32 + 16));
      }
      ws[j] = srow[j][b * kBlock / group];
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const uint4* xr = reinterpret_cast<const uint4*>(xq + r * in + b * kBlock);
      const uint4 xa = __ldg(xr), xb = __ldg(xr + 1);
      const float sx = __ldg(xs + r * n_blocks + b);
#pragma unroll
      for (int j = 0; j < kOuts; ++j) acc[r][j] = fmaf(static_cast<float>(block_dot(xa, xb, wa[j], wb[j])), sx * ws[j], acc[r][j]);
    }
  }

  __shared__ float partial[kWarps][R * kOuts];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int j = 0; j < kOuts; ++j) {
      float v = acc[r][j];
#pragma unroll
      for (int d = 16; d > 0; d /= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, d);
      if (lane == 0) partial[warp][r * kOuts + j] = v;
    }
  __syncthreads();
  for (int i = threadIdx.x; i < R * kOuts; i += kWarps * 32) {
    const int r = i / kOuts, j = i % kOuts;
    const int64_t o = o0 + j;
    if (o >= out) continue;
    float v = partial[0][i];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) v += partial[w][i];
    y[r * out + o] = bias != nullptr ? v + bias[o] : v;
  }
}

template <int R>
void launch_rows(const int8_t* xq, const float* xs, int64_t in, const void* q, bool int4, const float* scales, int64_t group,
                 const float* bias, float* y, int64_t out, cudaStream_t stream) {
  const unsigned grid = static_cast<unsigned>((out + kOuts - 1) / kOuts);
  const auto* w = static_cast<const uint8_t*>(q);
  if (int4)
    qgemv_rows<R, true><<<grid, kWarps * 32, 0, stream>>>(xq, xs, in, w, scales, group, bias, y, out);
  else
    qgemv_rows<R, false><<<grid, kWarps * 32, 0, stream>>>(xq, xs, in, w, scales, group, bias, y, out);
}

template <int... Rs>
void dispatch_rows(int64_t rows, std::integer_sequence<int, Rs...>, const int8_t* xq, const float* xs, int64_t in, const void* q, bool int4,
                   const float* scales, int64_t group, const float* bias, float* y, int64_t out, cudaStream_t stream) {
  // rows 1..16: the instantiation whose R is rows (Rs are 0..15)
  ((rows == Rs + 1 ? launch_rows<Rs + 1>(xq, xs, in, q, int4, scales, group, bias, y, out, stream) : void()), ...);
}

}  // namespace

void quantize_rows_q8_cuda(const float* x, int64_t rows, int64_t in, int8_t* xq, float* xs, void* stream) {
  const int64_t n_blocks = rows * in / kBlock;
  if (n_blocks == 0) return;
  const unsigned grid = static_cast<unsigned>((n_blocks + kQuantWarps - 1) / kQuantWarps);
  quantize_blocks<<<grid, kQuantWarps * 32, 0, static_cast<cudaStream_t>(stream)>>>(x, n_blocks, xq, xs);
  check_launch("quantizing x for the quantized GEMV");
}

void qgemv_cuda(const float* x, int64_t rows, int64_t in, const void* q, bool int4, const float* scales, int64_t group,
                const float* bias, float* y, int64_t out, int8_t* xq, float* xs, void* stream) {
  if (rows < 1 || rows > kCudaQgemvMaxRows || !qgemv_cuda_takes(in, group))
    throw std::runtime_error("qgemv_cuda: " + std::to_string(rows) + " rows of " + std::to_string(in) + " inputs in groups of " +
                             std::to_string(group) + " (valid: 1 to 16 rows, whole blocks of 32)");
  if (out == 0) return;
  quantize_rows_q8_cuda(x, rows, in, xq, xs, stream);
  dispatch_rows(rows, std::make_integer_sequence<int, kCudaQgemvMaxRows>{}, xq, xs, in, q, int4, scales, group, bias, y, out,
                static_cast<cudaStream_t>(stream));
  check_launch("the quantized GEMV");
}

}  // namespace colossal::kernels
