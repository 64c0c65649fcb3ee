// The avx512vnni table: AVX-512's kernels, with the quantized decoding GEMV's integer dot products
// from qdot_isa.cpp compiled with VNNI (see isa.h), and the quantized GEMM over vpdpbusd
// (qgemm_isa.cpp, in place of avx512's byte-pair copy). Only those two files are compiled a fourth time.
#include "kernels/cpu/isa_entry.h"

namespace colossal::kernels::COLOSSAL_ISA {

const IsaKernels& table() {
  static const IsaKernels t = [] {
    IsaKernels k = avx512::table();
    k.quantize_rows_q8 = &quantize_rows_q8;
    k.quantize_rows_w8a8 = &quantize_rows_w8a8;
    k.qgemv_q8x_int8 = &qgemv_q8x_int8;
    k.qgemv_q8x_int4 = &qgemv_q8x_int4;
    k.qgemm_columns = &qgemm_columns;
    k.qgemm_pack_columns = &qgemm_pack_columns;
    k.qgemm_split_x = false;   // vpdpbusd sums unsigned x signed bytes in int32: the panels meet x as it is
    k.qgemm_step_rows = true;
    return k;
  }();
  return t;
}

}  // namespace colossal::kernels::COLOSSAL_ISA
