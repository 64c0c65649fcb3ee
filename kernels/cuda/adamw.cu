// Fused multi-piece AdamW on CUDA: see adamw.h.
#include "kernels/cuda/adamw.h"

#include <cuda_runtime.h>

#include <climits>
#include <stdexcept>
#include <string>

namespace colossal::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kPerThread = 4;   // elements a thread loads before it computes: loads in flight per thread
constexpr int64_t kBlockElems = int64_t{kThreads} * kPerThread;
// Pieces per launch: the table travels as a kernel parameter (4 KiB on every architecture), so one
// launch needs no host-to-device copy of its own.
constexpr int kTablePieces = 64;

struct PieceTable {
  AdamWDevicePiece piece[kTablePieces];
  int64_t first_block[kTablePieces + 1];   // piece k owns blocks [first_block[k], first_block[k + 1])
  int count;
};
static_assert(sizeof(PieceTable) + sizeof(AdamWConsts<float>) <= 4096, "kernel parameters over 4 KiB");

// One element, as the CPU loop computes it: every product and sum rounded on its own.
__device__ __forceinline__ void update(float& param, float grad, float& m, float& v, const AdamWConsts<float>& c) {
  const float g = __fmul_rn(grad, c.grad_scale);
  const float p = __fmul_rn(param, c.decay);
  m = __fadd_rn(__fmul_rn(m, c.beta1), __fmul_rn(c.one_minus_beta1, g));
  v = __fadd_rn(__fmul_rn(v, c.beta2), __fmul_rn(__fmul_rn(c.one_minus_beta2, g), g));
  const float denom = __fadd_rn(__fmul_rn(__fsqrt_rn(v), c.inv_sqrt_bc2), c.eps);
  param = __fsub_rn(p, __fmul_rn(c.step_size, __fdiv_rn(m, denom)));
}

// Block b updates kBlockElems consecutive elements of one piece; a thread takes every kThreads-th of them
// (coalesced), loading all of its elements before computing any.
__global__ void __launch_bounds__(kThreads) adamw_pieces(const PieceTable t, const AdamWConsts<float> c) {
  const int64_t block = blockIdx.x;
  int k = 0;   // the same for the whole block: a short scan of the table in constant memory
  while (block >= t.first_block[k + 1]) ++k;
  const AdamWDevicePiece& piece = t.piece[k];
  float* __restrict__ param = piece.param;
  const float* __restrict__ grad = piece.grad;
  float* __restrict__ exp_avg = piece.exp_avg;
  float* __restrict__ exp_avg_sq = piece.exp_avg_sq;
  const int64_t begin = (block - t.first_block[k]) * kBlockElems + threadIdx.x;

  float p[kPerThread], g[kPerThread], m[kPerThread], v[kPerThread];
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const int64_t i = begin + int64_t{j} * kThreads;
    if (i < piece.n) p[j] = param[i], g[j] = grad[i], m[j] = exp_avg[i], v[j] = exp_avg_sq[i];
  }
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const int64_t i = begin + int64_t{j} * kThreads;
    if (i >= piece.n) continue;
    update(p[j], g[j], m[j], v[j], c);
    param[i] = p[j], exp_avg[i] = m[j], exp_avg_sq[i] = v[j];
  }
}

}  // namespace

void adamw_step_cuda(const AdamWDevicePiece* pieces, int64_t count, const AdamWHyper& h, void* stream) {
  const AdamWConsts<float> c = adamw_consts<float>(h);
  PieceTable table{};
  int64_t blocks = 0;
  const auto launch = [&] {
    if (table.count == 0) return;
    adamw_pieces<<<static_cast<unsigned>(blocks), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(table, c);
    if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess)
      throw std::runtime_error(std::string("AdamW on the GPU: kernel launch failed: ") + cudaGetErrorString(e));
    table.count = 0;
    blocks = 0;
  };
  for (int64_t i = 0; i < count; ++i) {
    const AdamWDevicePiece& piece = pieces[i];
    if (piece.n <= 0) continue;
    const int64_t need = (piece.n + kBlockElems - 1) / kBlockElems;
    if (need > INT_MAX) throw std::runtime_error("AdamW on the GPU: a piece of " + std::to_string(piece.n) + " elements is too long for one grid");
    if (table.count == kTablePieces || blocks + need > INT_MAX) launch();
    table.piece[table.count] = piece;
    table.first_block[table.count] = blocks;
    blocks += need;
    table.first_block[++table.count] = blocks;
  }
  launch();
}

}  // namespace colossal::kernels
