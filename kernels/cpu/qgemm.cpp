// Quantized GEMM, CPU: see qgemm.h. This file quantizes the x rows once and splits the output
// columns, in whole tiles, across the threads; the set's copy (qgemm_isa.cpp) multiplies one tile at
// a time, packing it first unless the weights were packed at load. Also here: the packing itself,
// its inverse, and the scalar loop that computes what the set's copy does.
#include "kernels/cpu/qgemm.h"

#include <algorithm>
#include <cmath>
#include <vector>
#include <omp.h>

#include "kernels/cpu/isa_kernels.h"
#include "kernels/cpu/qgemv.h"
#include "kernels/cpu/quantized_rows.h"
#include "kernels/cpu/thread_scratch.h"

namespace colossal::kernels {
namespace {

constexpr int64_t kBlock = 32;   // inputs per x scale, and per int4 block

int64_t tiles_of(int64_t out) { return (out + kQgemmColumns - 1) / kQgemmColumns; }
int64_t tile_bytes(int64_t in, bool int4) { return in * kQgemmColumns / (int4 ? 2 : 1); }

// Where input k of a tile's column c lies in the tile's panel (qgemm.h), and for int4 in which nibble.
struct PanelSpot {
  int64_t byte;
  bool high;
};
PanelSpot panel_spot(int64_t k, int64_t c, bool int4) {
  if (!int4) return {k / 4 * kQgemmPanelRow + c * 4 + k % 4, false};
  const int64_t e = k % kBlock, j = e % 16;   // the stored byte j of the block holds inputs j and j + 16
  return {(k / kBlock * 4 + j / 4) * kQgemmPanelRow + c * 4 + j % 4, e >= 16};
}

// Input k of column c in a tile's panel, as its unsigned value (int8 + 128, or the stored nibble).
int32_t panel_value(const uint8_t* tile, int64_t k, int64_t c, bool int4) {
  const PanelSpot s = panel_spot(k, c, int4);
  const uint8_t b = tile[s.byte];
  return int4 ? (s.high ? b >> 4 : b & 15) : b;
}

// Weight (n, k) as the panel's unsigned value: from the panels or from qgemv.h's row layout.
int32_t unsigned_weight(const QgemmProblem& p, int64_t n, int64_t k) {
  if (p.panels) return panel_value(p.panels + n / kQgemmColumns * tile_bytes(p.in, p.int4), k, n % kQgemmColumns, p.int4);
  if (!p.int4) return static_cast<int32_t>(static_cast<const int8_t*>(p.q)[n * p.in + k]) + 128;
  const uint8_t b = static_cast<const uint8_t*>(p.q)[n * p.in / 2 + k / kBlock * 16 + k % 16];
  return k % kBlock >= 16 ? b >> 4 : b & 15;
}

float weight_scale(const QgemmProblem& p, int64_t n, int64_t g) {
  const int64_t groups = p.in / p.group;
  return p.panels ? p.panel_scales[(n / kQgemmColumns * groups + g) * kQgemmColumns + n % kQgemmColumns] : p.scales[n * groups + g];
}

void run(const QgemmProblem& p) {
  const IsaKernels& k = active_kernels();
  const int64_t tiles = tiles_of(p.out);
  const int64_t bytes = p.out * p.in / (p.int4 ? 2 : 1);
  // Below ~64 KiB of weights the pool's wake-up costs more than a second core saves (as qgemv.cpp).
#pragma omp parallel if (tiles > 1 && bytes >= (1 << 16))
  {
    const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t per = (tiles + threads - 1) / threads;
    const int64_t begin = std::min(t * per, tiles) * kQgemmColumns, end = std::min((t + 1) * per * kQgemmColumns, p.out);
    if (begin < end) {
      if (!k.qgemm_columns) {
        qgemm_reference_columns(p, begin, end);
      } else {
        k.qgemm_columns(p, begin, end, qgemm_thread_scratch(p.in, p.group));
      }
    }
  }
}

void run_rows(const float* x, int64_t rows, int64_t in, const void* q, bool int4, const float* scales, int64_t group,
              const float* bias, float* y, int64_t out, const uint8_t* panels, const float* panel_scales) {
  const IsaKernels& k = active_kernels();
  const RowsFor use = int4 ? RowsFor::int4_panels : RowsFor::int8_panels;
  const QuantizedRows& xr = quantize_rows(k, x, rows, in, use);   // as the GEMV quantizes them
  QgemmProblem p{xr.q.data(), xr.s.data(), xr.sum.data(), rows, in, q, int4, scales, group, bias, y, out, panels, panel_scales};
  set_problem_rows(p, xr);
  run(p);
}

}  // namespace

uint8_t* qgemm_thread_scratch(int64_t in, int64_t group) {
  return reinterpret_cast<uint8_t*>(thread_scratch(static_cast<size_t>((qgemm_scratch_bytes(in, group) + 3) / 4)));
}

bool qgemm_available(int64_t in, int64_t group) { return active_kernels().qgemm_columns != nullptr && qgemv_integer_path(in, group); }

void qgemm_int8(const float* x, int64_t rows, int64_t in, const int8_t* q, const float* scales, int64_t group,
                const float* bias, float* y, int64_t out) {
  run_rows(x, rows, in, q, false, scales, group, bias, y, out, nullptr, nullptr);
}

void qgemm_int4(const float* x, int64_t rows, int64_t in, const uint8_t* q, const float* scales, int64_t group,
                const float* bias, float* y, int64_t out) {
  run_rows(x, rows, in, q, true, scales, group, bias, y, out, nullptr, nullptr);
}

void qgemm_packed(const float* x, int64_t rows, int64_t in, const uint8_t* panels, const float* panel_scales, bool int4, int64_t group,
                  const float* bias, float* y, int64_t out) {
  run_rows(x, rows, in, nullptr, int4, nullptr, group, bias, y, out, panels, panel_scales);
}

void qgemm_w8a8(const float* x, const float* divisor, int64_t rows, int64_t in, const uint8_t* panels, const float* panel_scales,
                const float* bias, float* y, int64_t out) {
  const IsaKernels& k = active_kernels();
  thread_local std::vector<int8_t> xq;
  thread_local std::vector<float> xs;
  thread_local std::vector<int32_t> sums;   // each row's integer sum: the panels hold w + 128, so 128 x it comes off
  xq.resize(static_cast<size_t>(rows * in));
  xs.resize(static_cast<size_t>(rows));
  sums.resize(static_cast<size_t>(rows));
  // (the calling thread's buffers: inside the parallel region `xq` would name each thread's own)
  int8_t* q = xq.data();
  float* s = xs.data();
  int32_t* sum = sums.data();
#pragma omp parallel for if (rows * in >= (1 << 16))
  for (int64_t m = 0; m < rows; ++m) k.quantize_rows_w8a8(x + m * in, divisor, 1, in, q + m * in, s + m, sum + m);
  QgemmProblem p{q, s, sum, rows, in, nullptr, false, nullptr, in, bias, y, out, panels, panel_scales};
  p.per_row = true;
  thread_local std::vector<int8_t> split;
  if (k.qgemm_split_x) {
    split.resize(static_cast<size_t>(2 * rows * in));
    qgemm_split_rows(q, rows, in, split.data());
  }
  p.split = split.data();
  run(p);
}

void qgemm_step_rows(const int8_t* xq, const float* xs, const int32_t* xsum, int64_t rows, int64_t in, bool int4, int8_t* step_x,
                     int32_t* step_start, float* step_xs) {
  const int64_t blocks = in / kBlock;
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t r = 0; r < rows; ++r) {
      std::copy_n(xq + r * in + b * kBlock, kBlock, step_x + (b * rows + r) * kBlock);
      step_start[b * rows + r] = qgemm_block_start(int4, xsum[r * blocks + b]);
      step_xs[b * rows + r] = xs[r * blocks + b];
    }
}

void qgemm_split_rows(const int8_t* xq, int64_t rows, int64_t in, int8_t* split) {
  for (int64_t m = 0; m < rows; ++m) {
    const int8_t* x = xq + m * in;
    int8_t* a = split + 2 * m * in;
    int8_t* b = a + in;
    for (int64_t k = 0; k < in; ++k) {
      const int32_t high = (x[k] + 8) >> 4;   // arithmetic: floor((x + 8) / 16)
      a[k] = static_cast<int8_t>(high);
      b[k] = static_cast<int8_t>(x[k] - 16 * high);
    }
  }
}

int64_t qgemm_packed_bytes(int64_t in, int64_t out, bool int4) { return tiles_of(out) * tile_bytes(in, int4); }
int64_t qgemm_packed_scales(int64_t in, int64_t out, int64_t group) { return tiles_of(out) * (in / group) * kQgemmColumns; }

void qgemm_pack(const void* q, const float* scales, bool int4, int64_t group, int64_t in, int64_t out, uint8_t* panels,
                float* panel_scales) {
  const int64_t tiles = tiles_of(out), groups = in / group, row_bytes = int4 ? in / 2 : in;
  if (const auto pack = active_kernels().qgemm_pack_columns) {   // gathers: the 124M shape's int8 layers 23 -> 13 ms
    QgemmProblem p{};
    p.in = in, p.q = q, p.int4 = int4, p.scales = scales, p.group = group, p.out = out;
#pragma omp parallel for
    for (int64_t t = 0; t < tiles; ++t) pack(p, t * kQgemmColumns, std::min((t + 1) * kQgemmColumns, out), panels, panel_scales);
    return;
  }
  const auto* bytes = static_cast<const uint8_t*>(q);
#pragma omp parallel for
  for (int64_t t = 0; t < tiles; ++t) {
    uint8_t* tile = panels + t * tile_bytes(in, int4);
    float* ts = panel_scales + t * groups * kQgemmColumns;
    for (int64_t c = 0; c < kQgemmColumns; ++c) {
      const int64_t n = t * kQgemmColumns + c;
      const uint8_t* row = bytes + n * row_bytes;
      if (int4) {   // the stored bytes move whole; a column past `out` is zero weights (8 in both nibbles)
        for (int64_t k = 0; k < in; k += kBlock)
          for (int64_t j = 0; j < 16; ++j) tile[panel_spot(k + j, c, true).byte] = n < out ? row[k / 2 + j] : 0x88;
      } else {
        for (int64_t k = 0; k < in; ++k) tile[panel_spot(k, c, false).byte] = n < out ? row[k] ^ 0x80 : 0x80;
      }
      for (int64_t g = 0; g < groups; ++g) ts[g * kQgemmColumns + c] = n < out ? scales[n * groups + g] : 0.0f;
    }
  }
}

void qgemm_unpack(const uint8_t* panels, const float* panel_scales, bool int4, int64_t group, int64_t in, int64_t out, void* q,
                  float* scales) {
  const int64_t groups = in / group, row_bytes = int4 ? in / 2 : in;
  auto* bytes = static_cast<uint8_t*>(q);
#pragma omp parallel for
  for (int64_t n = 0; n < out; ++n) {
    const uint8_t* tile = panels + n / kQgemmColumns * tile_bytes(in, int4);
    const int64_t c = n % kQgemmColumns;
    if (int4) {
      for (int64_t k = 0; k < in; k += kBlock)
        for (int64_t j = 0; j < 16; ++j) bytes[n * row_bytes + k / 2 + j] = tile[panel_spot(k + j, c, true).byte];
    } else {
      for (int64_t k = 0; k < in; ++k) bytes[n * row_bytes + k] = tile[panel_spot(k, c, false).byte] ^ 0x80;
    }
    for (int64_t g = 0; g < groups; ++g) scales[n * groups + g] = panel_scales[(n / kQgemmColumns * groups + g) * kQgemmColumns + c];
  }
}

void qgemm_packed_rows(const uint8_t* panels, const float* panel_scales, bool int4, int64_t group, int64_t in, const int64_t* ids,
                       int64_t n, float* rows) {
  const int64_t groups = in / group, offset = int4 ? 8 : 128;
  for (int64_t i = 0; i < n; ++i) {   // a row is one lane of its tile
    const int64_t c = ids[i] % kQgemmColumns;
    const uint8_t* tile = panels + ids[i] / kQgemmColumns * tile_bytes(in, int4);
    const float* scale = panel_scales + ids[i] / kQgemmColumns * groups * kQgemmColumns + c;
    for (int64_t k = 0; k < in; ++k)
      rows[i * in + k] = static_cast<float>(panel_value(tile, k, c, int4) - offset) * scale[k / group * kQgemmColumns];
  }
}

void qgemm_reference_columns(const QgemmProblem& p, int64_t n_begin, int64_t n_end) {
  const int64_t blocks = p.in / kBlock, per_group = p.group / kBlock, groups = p.in / p.group;
  const int32_t offset = p.int4 ? 8 : 128;
  if (p.per_row) {
    for (int64_t m = 0; m < p.rows; ++m)
      for (int64_t n = n_begin; n < n_end; ++n) {
        int32_t sum = 0;
        for (int64_t k = 0; k < p.in; ++k) sum += unsigned_weight(p, n, k) * p.xq[m * p.in + k];
        const float y = static_cast<float>(sum - offset * p.xsum[m]) * p.xs[m] * weight_scale(p, n, 0);
        p.y[m * p.out + n] = p.bias ? y + p.bias[n] : y;
      }
    return;
  }
  for (int64_t m = 0; m < p.rows; ++m)
    for (int64_t n = n_begin; n < n_end; ++n) {
      float total = 0.0f;
      for (int64_t g = 0; g < groups; ++g) {
        float acc = 0.0f;
        for (int64_t b = g * per_group; b < (g + 1) * per_group; ++b) {
          int32_t sum = 0;
          for (int64_t k = b * kBlock; k < (b + 1) * kBlock; ++k) sum += unsigned_weight(p, n, k) * p.xq[m * p.in + k];
          const int64_t row = m * blocks + b;
          acc = std::fma(static_cast<float>(sum - offset * p.xsum[row]), p.xs[row], acc);
        }
        total = std::fma(weight_scale(p, n, g), acc, total);
      }
      p.y[m * p.out + n] = total + (p.bias ? p.bias[n] : 0.0f);
    }
}

}  // namespace colossal::kernels
