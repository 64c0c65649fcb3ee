// One instruction set's table of kernel entry points (see isa_kernels.h), compiled once per set.
#include "kernels/cpu/isa_entry.h"
#include "kernels/cpu/simd.h"

namespace colossal::kernels::COLOSSAL_ISA {

const IsaKernels& table() {
  static const IsaKernels t = [] {
    IsaKernels k{kLanes,          &attention_forward_head, &attention_backward_head, &gelu_forward_chunk,
                            &gelu_forward_grad_chunk, &softmax_ce_row,   &adamw_chunk_f32,         &adamw_chunk_f64,
                            &gemv,           &qgemv_int8,            &qgemv_int4, &quantize_rows_q8, &qgemv_q8x_int8, &qgemv_q8x_int4, &attention_decode_head, &attention_paged_head, &layer_norm_forward_rows,
                            &layer_norm_backward_rows, &gemm_rows, gemm_tile_rows, &gemm_pass_depth, &sum_squares_f32, &sum_squares_f64, &gemv_t,
                            &accumulate_bf16, &accumulate_fp16, &adamw_chunk_f32_bf16, &adamw_chunk_f32_fp16, &sum_squares_bf16, &sum_squares_fp16, &store_kv};
    k.quantize_rows_w8a8 = &quantize_rows_w8a8;
#if defined(__AVX2__)
    k.qgemm_columns = &qgemm_columns;   // qgemm_maddubs_isa.cpp (the avx512vnni and amx tables put their own)
    k.qgemm_pack_columns = &qgemm_pack_columns;
    k.qgemm_split_x = true;
#endif
    return k;
  }();
  return t;
}

}  // namespace colossal::kernels::COLOSSAL_ISA
