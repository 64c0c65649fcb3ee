// Decoding attention on CUDA over a KV cache of any element kind: see decode_attention.h.
#include "kernels/cuda/decode_attention.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace colossal::kernels {
namespace {

constexpr int kThreads = 128;
constexpr unsigned kFull = 0xFFFFFFFFu;

template <KvElement E>
using Stored = KvStored<E>;

// An int8 row's scale: the 4 bytes after its d values, assembled byte by byte (rows of odd d start off a
// float's alignment); 1 for the other kinds.
template <KvElement E>
__device__ __forceinline__ float row_scale(const Stored<E>* row, int d) {
  if constexpr (E == KvElement::int8) {
    const auto* b = reinterpret_cast<const unsigned char*>(row + d);
    const unsigned bits = unsigned{b[0]} | unsigned{b[1]} << 8 | unsigned{b[2]} << 16 | unsigned{b[3]} << 24;
    return __uint_as_float(bits);
  } else {
    return 1.0f;
  }
}

// One stored element as the float it stands for (kv_element.h): exact widening, or float(q) * scale.
template <KvElement E>
__device__ __forceinline__ float widen(Stored<E> x, float scale) {
  if constexpr (E == KvElement::f32) return x;
  else if constexpr (E == KvElement::fp16) return __half2float(__ushort_as_half(x));
  else if constexpr (E == KvElement::bf16) return __uint_as_float(static_cast<unsigned>(x) << 16);
  else return __fmul_rn(static_cast<float>(x), scale);
}

// The block's max or sum of v, every thread getting it; `red` holds a float per warp.
template <bool kMax>
__device__ __forceinline__ float block_reduce(float v, float* red) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) {
    const float w = __shfl_xor_sync(kFull, v, o);
    v = kMax ? fmaxf(v, w) : v + w;
  }
  const int warp = threadIdx.x / 32, warps = blockDim.x / 32;
  __syncthreads();   // red may still be read from the last reduction
  if (threadIdx.x % 32 == 0) red[warp] = v;
  __syncthreads();
  float r = red[0];
  for (int i = 1; i < warps; ++i) r = kMax ? fmaxf(r, red[i]) : r + red[i];
  return r;
}

template <KvElement E>
__global__ void __launch_bounds__(kThreads) decode_attention_kernel(CudaDecodeAttention a) {
  extern __shared__ float shared[];   // scores [length], partial sums [max(kThreads, d)], reductions [32]
  const int64_t task = blockIdx.x, b = task / a.heads, h = task % a.heads, n = a.length;
  const int d = static_cast<int>(a.head_dim), lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  const int64_t row = E == KvElement::int8 ? d + kKvScaleBytes : d;   // kv_row_elements, a host function
  const Stored<E>* k = static_cast<const Stored<E>*>(a.k) + task * a.capacity * row;
  const Stored<E>* v = static_cast<const Stored<E>*>(a.v) + task * a.capacity * row;
  const float* q = a.q + b * a.q_batch_stride + h * d;
  const bool* valid = a.valid ? a.valid + b * a.valid_stride : nullptr;
  float* s = shared;
  float* partial = shared + n;
  float* red = partial + (d > kThreads ? d : kThreads);
  const float slope = a.alibi_slopes ? a.alibi_slopes[h] : 0.0f;
  const int64_t query = a.query_position ? *a.query_position : a.query_position_host;

  // 1. Scores: a warp per position, its lanes across the head.
  for (int64_t j = warp; j < n; j += warps) {
    const Stored<E>* kj = k + j * row;
    const float ks = row_scale<E>(kj, d);
    float acc = 0.0f;
    for (int c = lane; c < d; c += 32) acc = fmaf(q[c], widen<E>(kj[c], ks), acc);
#pragma unroll
    for (int o = 16; o > 0; o /= 2) acc += __shfl_xor_sync(kFull, acc, o);
    if (lane == 0) {
      float score = acc * a.scale;
      if (slope != 0.0f) score += slope * static_cast<float>(j - query);
      s[j] = valid && !valid[j] ? -INFINITY : score;
    }
  }
  __syncthreads();

  // 2. Softmax over the valid positions (none: a zero output).
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) m = fmaxf(m, s[j]);
  m = block_reduce<true>(m, red);
  float* out = a.out + task * d;
  if (m == -INFINITY) {
    for (int c = threadIdx.x; c < d; c += blockDim.x) out[c] = 0.0f;
    return;
  }
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const float e = s[j] == -INFINITY ? 0.0f : expf(s[j] - m);
    s[j] = e;
    sum += e;
  }
  sum = block_reduce<false>(sum, red);   // its barriers also publish s

  // 3. Weighted values: `groups` sets of d threads, each over every groups-th position, then summed.
  const int groups = d < kThreads ? kThreads / d : 1;
  for (int idx = threadIdx.x; idx < groups * d; idx += blockDim.x) {
    const int g = idx / d, c = idx % d;
    float acc = 0.0f;
    for (int64_t j = g; j < n; j += groups) {
      const Stored<E>* vj = v + j * row;
      acc = fmaf(s[j], widen<E>(vj[c], row_scale<E>(vj, d)), acc);
    }
    partial[idx] = acc;
  }
  __syncthreads();
  const float inv = 1.0f / sum;
  for (int c = threadIdx.x; c < d; c += blockDim.x) {
    float total = 0.0f;
    for (int g = 0; g < groups; ++g) total += partial[g * d + c];
    out[c] = total * inv;
  }
}

}  // namespace

void decode_attention_cuda(const CudaDecodeAttention& a, void* stream) {
  if (a.length < 1 || a.length > kCudaDecodeAttentionMaxLength || a.head_dim < 1)
    throw std::runtime_error("decode_attention_cuda: " + std::to_string(a.length) + " positions of " + std::to_string(a.head_dim) +
                             " (1 to " + std::to_string(kCudaDecodeAttentionMaxLength) + " positions)");
  const int64_t d = a.head_dim;
  const size_t shared = static_cast<size_t>(a.length + (d > kThreads ? d : kThreads) + 32) * sizeof(float);
  const auto s = static_cast<cudaStream_t>(stream);
  const dim3 grid(static_cast<unsigned>(a.batch * a.heads));
  switch (a.element) {
    case KvElement::f32: decode_attention_kernel<KvElement::f32><<<grid, kThreads, shared, s>>>(a); break;
    case KvElement::fp16: decode_attention_kernel<KvElement::fp16><<<grid, kThreads, shared, s>>>(a); break;
    case KvElement::bf16: decode_attention_kernel<KvElement::bf16><<<grid, kThreads, shared, s>>>(a); break;
    case KvElement::int8: decode_attention_kernel<KvElement::int8><<<grid, kThreads, shared, s>>>(a); break;
  }
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw std::runtime_error(std::string("decode_attention_cuda: ") + cudaGetErrorString(e));
}

}  // namespace colossal::kernels
