// The walk over a quantized GEMM's output tiles that each kernel set's copy of qgemm_columns and
// qgemm_pack_columns takes (qgemm_isa.cpp, qgemm_maddubs_isa.cpp; see qgemm.h): each copy brings its own
// packer of one tile and its own loop over a tile's rows. In the set's namespace, as the files including it.
#pragma once
#include "kernels/cpu/qgemm.h"

#ifndef COLOSSAL_ISA
#error "qgemm_tiles.h belongs to a kernel set's copy (COLOSSAL_ISA)"
#endif

namespace colossal::kernels::COLOSSAL_ISA {

inline int64_t qgemm_tile_bytes(const QgemmProblem& p) { return p.in * kQgemmColumns / (p.int4 ? 2 : 1); }

// For each tile of 16 columns in [n_begin, n_end) (the last may have fewer: `valid`): its panel and
// scales, where qgemm_pack put them at load, or packed now by pack(p, n0, valid, panel, scales) into the
// thread's `scratch`; then rows(panel, scales, n0, valid).
template <class Pack, class Rows>
void for_each_tile(const QgemmProblem& p, int64_t n_begin, int64_t n_end, uint8_t* scratch, const Pack& pack, const Rows& rows) {
  const int64_t groups = p.in / p.group;
  for (int64_t n0 = n_begin; n0 < n_end; n0 += kQgemmColumns) {
    const int64_t valid = n_end - n0 < kQgemmColumns ? n_end - n0 : kQgemmColumns;
    const uint8_t* panel = scratch;
    const float* scales = reinterpret_cast<const float*>(scratch + p.in * kQgemmColumns);
    if (p.panels) {
      panel = p.panels + n0 / kQgemmColumns * qgemm_tile_bytes(p);
      scales = p.panel_scales + n0 / kQgemmColumns * groups * kQgemmColumns;
    } else {
      pack(p, n0, valid, scratch, reinterpret_cast<float*>(scratch + p.in * kQgemmColumns));
    }
    rows(panel, scales, n0, valid);
  }
}

// qgemm_pack_columns: each tile of [n_begin, n_end) packed by `pack` at its offsets in the panels.
template <class Pack>
void pack_each_tile(const QgemmProblem& p, int64_t n_begin, int64_t n_end, uint8_t* panels, float* panel_scales, const Pack& pack) {
  const int64_t groups = p.in / p.group;
  for (int64_t n0 = n_begin; n0 < n_end; n0 += kQgemmColumns) {
    const int64_t t = n0 / kQgemmColumns, valid = n_end - n0 < kQgemmColumns ? n_end - n0 : kQgemmColumns;
    pack(p, n0, valid, panels + t * qgemm_tile_bytes(p), panel_scales + t * groups * kQgemmColumns);
  }
}

}  // namespace colossal::kernels::COLOSSAL_ISA
