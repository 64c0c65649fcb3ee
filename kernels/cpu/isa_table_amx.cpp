// The amx table: avx512vnni's kernels, with the quantized prompt GEMM of qgemm_isa.cpp compiled again
// with AMX's int8 tiles (see isa.h). Only that file is compiled a fifth time.
#include "kernels/cpu/isa_entry.h"

namespace colossal::kernels::COLOSSAL_ISA {

const IsaKernels& table() {
  static const IsaKernels t = [] {
    IsaKernels k = avx512vnni::table();
    k.qgemm_columns = &qgemm_columns;
    k.qgemm_pack_columns = &qgemm_pack_columns;
    return k;
  }();
  return t;
}

}  // namespace colossal::kernels::COLOSSAL_ISA
