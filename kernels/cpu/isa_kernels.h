// The per-instruction-set entry points of the CPU kernels: the functions each *_isa.cpp defines once
// per set (namespaces baseline, avx2, avx512), gathered into one table per set. Only the dispatching
// files (attention.cpp, gelu.cpp, ...) include this; they own threading and scratch memory, the
// *_isa.cpp files own the arithmetic of one task.
#pragma once
#include <cstdint>

#include "kernels/cpu/adamw.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/kv_element.h"
#include "kernels/cpu/qgemm.h"

namespace colossal::kernels {

// One (batch, head) of causal attention: row 0 of q, k and v inside the packed QKV [T, 3C] rows.
struct AttentionHead {
  const float *q, *k, *v;
  int64_t stride;       // 3C: from one token's q to the next
  int64_t out_stride;   // C: the same in out, d_out and lse-free outputs
};

// Per-thread buffers of one head: kt and vt [D][ld] (K and V transposed), p and dp [kAttentionRows][ld]
// (a block of queries' probability and gradient rows, ld apart), dk and dv [T][D] (the generic head
// size's sums), with ld = T rounded up to kAttentionPad.
struct AttentionScratch {
  float *kt, *vt, *p, *dp, *dk, *dv;
};
constexpr int64_t kAttentionPad = 16;   // the widest vector's float lanes, so every set fits one layout
constexpr int64_t kAttentionRows = 48;  // queries per backward block: a multiple of every set's tile rows
// ld: a head's sequence length rounded up to kAttentionPad (static: each set's copy keeps its own).
static constexpr int64_t attention_ld(int64_t seq) { return (seq + kAttentionPad - 1) / kAttentionPad * kAttentionPad; }


struct IsaKernels {
  int lanes;   // floats per vector register
  void (*attention_forward_head)(const AttentionHead& h, float* out, float* lse, int64_t t_len, int64_t d, float scale,
                                 const AttentionScratch& w);
  void (*attention_backward_head)(const AttentionHead& h, const float* out, const float* d_out, const float* lse,
                                  float* dq, float* dk, float* dv, int64_t t_len, int64_t d, float scale,
                                  const AttentionScratch& w);
  void (*gelu_tanh_forward)(const float* x, float* y, int64_t n);
  void (*gelu_tanh_forward_with_grad)(const float* x, float* y, float* dydx, int64_t n);
  // Softmax cross entropy of one row in place (the row becomes its gradient times grad_scale); returns the loss.
  float (*softmax_ce_row)(float* row, int64_t target, int64_t cols, float grad_scale);
  void (*adamw_f32)(float* p, const float* g, float* m, float* v, int64_t n, const AdamWConsts<float>& c);
  void (*adamw_f64)(double* p, const double* g, double* m, double* v, int64_t n, const AdamWConsts<double>& c);
  // y[r][o] = x[r] . w[o] (+ bias[o]) for r < rows, o in [o_begin, o_end); w is [out][in] row-major,
  // x rows are `in` apart, y rows `ldy` apart.
  void (*gemv)(const float* x, int64_t rows, int64_t in, const float* w, const float* bias, float* y, int64_t ldy,
               int64_t o_begin, int64_t o_end);
  // The same with W stored as int8 or packed int4 and a scale per `group` inputs (see qgemv.h).
  void (*qgemv_int8)(const float* x, int64_t rows, int64_t in, const int8_t* q, const float* scales, int64_t group,
                     const float* bias, float* y, int64_t ldy, int64_t o_begin, int64_t o_end);
  void (*qgemv_int4)(const float* x, int64_t rows, int64_t in, const uint8_t* q, const float* scales, int64_t group,
                     const float* bias, float* y, int64_t ldy, int64_t o_begin, int64_t o_end);
  // x rows quantized for the integer path: each block of 32 floats to int8 (absmax / 127 scale), its
  // absolute values beside it, each block's 8 * sum * scale (int4's offset) and its integer sum (the
  // prompt GEMM's offsets); and the quantized GEMVs over such rows (qdot_isa.cpp).
  void (*quantize_rows_q8)(const float* x, int64_t n_blocks, int8_t* xq, uint8_t* xa, float* xs, float* xc, int32_t* xsum);
  void (*qgemv_q8x_int8)(const int8_t* xq, const uint8_t* xa, const float* xs, const float* xc, int64_t rows, int64_t in, const int8_t* q,
                         const float* scales, int64_t group, const float* bias, float* y, int64_t ldy, int64_t o_begin,
                         int64_t o_end);
  void (*qgemv_q8x_int4)(const int8_t* xq, const uint8_t* xa, const float* xs, const float* xc, int64_t rows, int64_t in, const uint8_t* q,
                         const float* scales, int64_t group, const float* bias, float* y, int64_t ldy, int64_t o_begin,
                         int64_t o_end);
  // One decoding query q[d] at position n - 1 against n cached keys and values ([n][kv_row_elements] rows of element
  // e), positions with valid[j] == 0 (when valid is given) left out: out[d] = softmax(scale q k^T + bias) v,
  // where slope != 0 makes bias ALiBi's slope * (j - (n - 1)) (else none). s: n floats of scratch.
  void (*attention_decode_head)(const float* q, const void* k, const void* v, KvElement e, int64_t n, int64_t d, float scale,
                                float slope, const uint8_t* valid, float* s, float* out);
  // The same for a query at position n - 1 whose keys and values live in blocks (paged_attention.h): this
  // head's block b starts at k_base + table[b] * block_stride elements (v_base alike), block_size rows of
  // d; slope != 0 adds ALiBi's slope * (j - (n - 1)).
  void (*attention_paged_head)(const float* q, const void* k_base, const void* v_base, KvElement e, const int32_t* table,
                               int64_t n, int64_t block_size, int64_t block_stride, int64_t d, float scale, float slope, float* s,
                               float* out);
  // LayerNorm of `rows` rows (see layer_norm.h); the backward writes its block's dgamma and dbeta sums.
  void (*layer_norm_forward)(const float* x, const float* gamma, const float* beta, float* y, float* mean, float* rstd,
                             int64_t rows, int64_t cols, float eps);
  void (*layer_norm_backward)(const float* dy, const float* x, const float* mean, const float* rstd,
                              const float* gamma, float* dx, float* dgamma, float* dbeta, int64_t rows, int64_t cols);
  // Rows [m_begin, m_end) and columns [n_begin, n_end) of a GEMM's C (see gemm.h); n_begin a multiple
  // of kGemmColumnMultiple. scratch: gemm_scratch_floats(m_end - m_begin, gemm_pass_depth(p), p.a_depth != 1)
  // of the calling thread's own.
  void (*gemm_rows)(const GemmProblem& p, int64_t m_begin, int64_t m_end, int64_t n_begin, int64_t n_end, float* scratch);
  int gemm_tile_rows;   // rows of gemm_rows' register tile: threads split C's rows in multiples of it
  int64_t (*gemm_pass_depth)(const GemmProblem& p);   // reduction steps per pass over B, at most kGemmDepthBlock
  // The sum of x[i]^2 in double (the gradient norm's pass).
  double (*sum_squares_f32)(const float* x, int64_t n);
  double (*sum_squares_f64)(const double* x, int64_t n);
  // gemv with W stored transposed: wt [in][out] row-major, rows `ldw` apart (see gemv.h's gemv_t).
  void (*gemv_t)(const float* x, int64_t rows, int64_t in, const float* wt, int64_t ldw, const float* bias, float* y, int64_t ldy,
                 int64_t o_begin, int64_t o_end);
  // dst[i] += float(src[i]) over 16-bit floats' bits (accumulate.h).
  void (*accumulate_bf16)(float* dst, const uint16_t* src, int64_t n);
  void (*accumulate_fp16)(float* dst, const uint16_t* src, int64_t n);
  // adamw_f32 reading 16-bit gradients (bf16, fp16), each widened and multiplied by `factor` first.
  void (*adamw_f32_bf16)(float* p, const uint16_t* g, float* m, float* v, int64_t n, const AdamWConsts<float>& c, float factor);
  void (*adamw_f32_fp16)(float* p, const uint16_t* g, float* m, float* v, int64_t n, const AdamWConsts<float>& c, float factor);
  // sum_squares_f32 over 16-bit values widened (the same bits as over their fp32 copy).
  double (*sum_squares_bf16)(const uint16_t* x, int64_t n);
  double (*sum_squares_fp16)(const uint16_t* x, int64_t n);
  // One row of n floats into a KV cache's element e at dst (kv_element.h: 16-bit kinds rounded to
  // nearest-even; int8 quantized with its scale after the n values).
  void (*store_kv)(const float* src, void* dst, int64_t n, KvElement e);
  // Columns [n_begin, n_end) of a quantized GEMM (qgemm.h); null in the baseline set, whose prompts
  // take the fp32 GEMM with the weights dequantized as it packs them.
  void (*qgemm_columns)(const QgemmProblem& p, int64_t n_begin, int64_t n_end, uint8_t* scratch) = nullptr;
  // Whether qgemm_columns multiplies int8 panels by x split into 16 a + b (QgemmProblem::split): the
  // sets without VNNI (qgemm_maddubs_isa.cpp).
  bool qgemm_split_x = false;
  // Whether qgemm_columns reads a decoding step's rows (at most kQgemmStepRows) over packed panels as
  // qgemm_step_rows lays them out, where the problem has them (QgemmProblem::step_x): the VNNI sets.
  bool qgemm_step_rows = false;
  // Packs p.q's columns [n_begin, n_end) (whole tiles, the last may be partial) into qgemm.h's panels
  // at their tiles' offsets in `panels` and `panel_scales`; null where qgemm_columns is (qgemm_pack's
  // scalar loop).
  void (*qgemm_pack_columns)(const QgemmProblem& p, int64_t n_begin, int64_t n_end, uint8_t* panels, float* panel_scales) = nullptr;
  // W8A8's x rows (qgemm_w8a8): each of `rows` rows of `in` floats (in a multiple of 32), divided by
  // `divisor` [in] first where it is not null (SmoothQuant's s), to int8 at its absmax / 127, with that
  // scale and the row's integer sum; rounded as ATen's ops round them (qdot_isa.cpp).
  void (*quantize_rows_w8a8)(const float* x, const float* divisor, int64_t rows, int64_t in, int8_t* xq, float* xs, int32_t* xsum) = nullptr;
};

// The table of `isa` (which the caller has checked the machine can run).
const IsaKernels& isa_kernels(Isa isa);
// The table of active_isa().
inline const IsaKernels& active_kernels() { return isa_kernels(active_isa()); }

#define COLOSSAL_DECLARE_ISA_TABLE(ns) \
  namespace ns {                        \
  const IsaKernels& table();            \
  }
COLOSSAL_DECLARE_ISA_TABLE(baseline)
COLOSSAL_DECLARE_ISA_TABLE(avx2)
COLOSSAL_DECLARE_ISA_TABLE(avx512)
COLOSSAL_DECLARE_ISA_TABLE(avx512vnni)
COLOSSAL_DECLARE_ISA_TABLE(amx)
#undef COLOSSAL_DECLARE_ISA_TABLE

}  // namespace colossal::kernels
