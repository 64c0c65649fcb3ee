// Causal attention for short sequences, CPU: see attention.h. One task per (batch, head) split across
// OpenMP threads, each with its own scratch; the per-head loops are the active instruction set's
// (attention_isa.cpp).
#include "kernels/cpu/attention.h"

#include "kernels/cpu/isa_kernels.h"
#include "kernels/cpu/thread_scratch.h"

namespace colossal::kernels {
namespace {

AttentionHead head_at(const float* qkv, const AttentionDims& a, int64_t b, int64_t hd) {
  const int64_t c = a.heads * a.head_dim;
  const float* q = qkv + b * a.seq * 3 * c + hd * a.head_dim;
  return {q, q + c, q + 2 * c, 3 * c, c};
}

// This thread's buffers for one head at a time (see AttentionScratch), in its kept scratch.
AttentionScratch scratch_for(const AttentionDims& a) {
  const int64_t ld = attention_ld(a.seq);
  const int64_t mat = ld * a.head_dim, rows = a.seq * a.head_dim, blk = kAttentionRows * ld;
  float* p = thread_scratch(static_cast<size_t>(2 * mat + 2 * blk + 2 * rows));
  return {p, p + mat, p + 2 * mat, p + 2 * mat + blk, p + 2 * mat + 2 * blk, p + 2 * mat + 2 * blk + rows};
}

}  // namespace

void causal_attention_forward(const float* qkv, float* out, float* lse, const AttentionDims& a) {
  const int64_t c = a.heads * a.head_dim, tasks = a.batch * a.heads;
  const auto head = active_kernels().attention_forward_head;
#pragma omp parallel if (tasks > 1)
  {
    const AttentionScratch w = scratch_for(a);
#pragma omp for schedule(static)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t b = task / a.heads, hd = task % a.heads;
      head(head_at(qkv, a, b, hd), out + b * a.seq * c + hd * a.head_dim, lse + task * a.seq, a.seq, a.head_dim, a.scale,
           w);
    }
  }
}

void causal_attention_backward(const float* qkv, const float* out, const float* lse, const float* d_out, float* d_qkv,
                               const AttentionDims& a) {
  const int64_t c = a.heads * a.head_dim, tasks = a.batch * a.heads;
  const auto head = active_kernels().attention_backward_head;
#pragma omp parallel if (tasks > 1)
  {
    const AttentionScratch w = scratch_for(a);
#pragma omp for schedule(static)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t b = task / a.heads, hd = task % a.heads;
      const int64_t out_off = b * a.seq * c + hd * a.head_dim, in_off = b * a.seq * 3 * c + hd * a.head_dim;
      float* dq = d_qkv + in_off;
      head(head_at(qkv, a, b, hd), out + out_off, d_out + out_off, lse + task * a.seq, dq, dq + c, dq + 2 * c, a.seq,
           a.head_dim, a.scale, w);
    }
  }
}

}  // namespace colossal::kernels
