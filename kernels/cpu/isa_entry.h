// The functions every instruction set's copy defines (in namespace COLOSSAL_ISA), declared once so
// each *_isa.cpp and the table in isa_table.cpp agree on them. See isa_kernels.h for what each does.
#pragma once
#include "kernels/cpu/isa_kernels.h"

#ifndef COLOSSAL_ISA
#error "COLOSSAL_ISA must name the instruction set this copy is compiled for (see kernels/CMakeLists.txt)"
#endif

namespace colossal::kernels::COLOSSAL_ISA {

void attention_forward_head(const AttentionHead& h, float* out, float* lse, int64_t t_len, int64_t d, float scale,
                            const AttentionScratch& w);
void attention_backward_head(const AttentionHead& h, const float* out, const float* d_out, const float* lse, float* dq,
                             float* dk, float* dv, int64_t t_len, int64_t d, float scale, const AttentionScratch& w);
void gelu_forward_chunk(const float* x, float* y, int64_t n);
void gelu_forward_grad_chunk(const float* x, float* y, float* dydx, int64_t n);
float softmax_ce_row(float* row, int64_t target, int64_t cols, float grad_scale);
void adamw_chunk_f32(float* p, const float* g, float* m, float* v, int64_t n, const AdamWConsts<float>& c);
void adamw_chunk_f64(double* p, const double* g, double* m, double* v, int64_t n, const AdamWConsts<double>& c);
void adamw_chunk_f32_bf16(float* p, const uint16_t* g, float* m, float* v, int64_t n, const AdamWConsts<float>& c, float factor);
void adamw_chunk_f32_fp16(float* p, const uint16_t* g, float* m, float* v, int64_t n, const AdamWConsts<float>& c, float factor);
double sum_squares_f32(const float* x, int64_t n);
double sum_squares_f64(const double* x, int64_t n);
double sum_squares_bf16(const uint16_t* x, int64_t n);
double sum_squares_fp16(const uint16_t* x, int64_t n);
void accumulate_bf16(float* dst, const uint16_t* src, int64_t n);
void accumulate_fp16(float* dst, const uint16_t* src, int64_t n);
void gemv(const float* x, int64_t rows, int64_t in, const float* w, const float* bias, float* y, int64_t ldy,
          int64_t o_begin, int64_t o_end);
void gemv_t(const float* x, int64_t rows, int64_t in, const float* wt, int64_t ldw, const float* bias, float* y, int64_t ldy,
            int64_t o_begin, int64_t o_end);
void qgemv_int8(const float* x, int64_t rows, int64_t in, const int8_t* q, const float* scales, int64_t group,
                const float* bias, float* y, int64_t ldy, int64_t o_begin, int64_t o_end);
void qgemv_int4(const float* x, int64_t rows, int64_t in, const uint8_t* q, const float* scales, int64_t group,
                const float* bias, float* y, int64_t ldy, int64_t o_begin, int64_t o_end);
void quantize_rows_q8(const float* x, int64_t n_blocks, int8_t* xq, uint8_t* xa, float* xs, float* xc, int32_t* xsum);
void quantize_rows_w8a8(const float* x, const float* divisor, int64_t rows, int64_t in, int8_t* xq, float* xs, int32_t* xsum);
void qgemv_q8x_int8(const int8_t* xq, const uint8_t* xa, const float* xs, const float* xc, int64_t rows, int64_t in, const int8_t* q,
                    const float* scales, int64_t group, const float* bias, float* y, int64_t ldy, int64_t o_begin, int64_t o_end);
void qgemv_q8x_int4(const int8_t* xq, const uint8_t* xa, const float* xs, const float* xc, int64_t rows, int64_t in, const uint8_t* q,
                    const float* scales, int64_t group, const float* bias, float* y, int64_t ldy, int64_t o_begin, int64_t o_end);
void qgemm_columns(const QgemmProblem& p, int64_t n_begin, int64_t n_end, uint8_t* scratch);   // not in baseline
void qgemm_pack_columns(const QgemmProblem& p, int64_t n_begin, int64_t n_end, uint8_t* panels, float* panel_scales);   // not in baseline
void attention_decode_head(const float* q, const void* k, const void* v, KvElement e, int64_t n, int64_t d, float scale,
                           float slope, const uint8_t* valid, float* s, float* out);
void attention_paged_head(const float* q, const void* k_base, const void* v_base, KvElement e, const int32_t* table, int64_t n,
                          int64_t block_size, int64_t block_stride, int64_t d, float scale, float slope, float* s, float* out);
void store_kv(const float* src, void* dst, int64_t n, KvElement e);
void layer_norm_forward_rows(const float* x, const float* gamma, const float* beta, float* y, float* mean, float* rstd,
                             int64_t rows, int64_t cols, float eps);
void layer_norm_backward_rows(const float* dy, const float* x, const float* mean, const float* rstd,
                              const float* gamma, float* dx, float* dgamma, float* dbeta, int64_t rows, int64_t cols);
void gemm_rows(const GemmProblem& p, int64_t m_begin, int64_t m_end, int64_t n_begin, int64_t n_end, float* scratch);
extern const int gemm_tile_rows;
int64_t gemm_pass_depth(const GemmProblem& p);

}  // namespace colossal::kernels::COLOSSAL_ISA
