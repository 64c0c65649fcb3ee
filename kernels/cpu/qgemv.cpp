// Quantized decoding GEMV, CPU: see qgemv.h. Output rows are shared among the threads as gemv.cpp
// shares them (row_groups.h), each range running the active instruction set's loop (qgemv_isa.cpp).
#include "kernels/cpu/qgemv.h"

#include <algorithm>
#include <vector>

#include "kernels/cpu/isa_kernels.h"
#include "kernels/cpu/qgemm.h"
#include "kernels/cpu/quantized_rows.h"
#include "kernels/cpu/row_groups.h"

namespace colossal::kernels {
namespace {

// Below ~64 KiB of weights the pool's wake-up costs more than a second core saves.
bool worth_threads(int64_t weight_bytes) { return weight_bytes >= (1 << 16); }

}  // namespace

const QuantizedRows& quantize_rows(const IsaKernels& k, const float* x, int64_t rows, int64_t in, RowsFor use) {
  thread_local QuantizedRows r;
  const auto n = static_cast<size_t>(rows * in);
  if (r.q.size() < n) r.q.resize(n), r.a.resize(n), r.s.resize(n / kQ8Block), r.c.resize(n / kQ8Block), r.sum.resize(n / kQ8Block);
  k.quantize_rows_q8(x, rows * in / kQ8Block, r.q.data(), r.a.data(), r.s.data(), r.c.data(), r.sum.data());
  r.has_split = use == RowsFor::int8_panels && k.qgemm_split_x;
  if (r.has_split) {
    if (r.split.size() < 2 * n) r.split.resize(2 * n);
    qgemm_split_rows(r.q.data(), rows, in, r.split.data());
  }
  r.has_step = use != RowsFor::gemv && k.qgemm_step_rows && rows <= kQgemmStepRows;
  if (r.has_step) {
    if (r.step_x.size() < n) r.step_x.resize(n), r.step_start.resize(n / kQ8Block), r.step_xs.resize(n / kQ8Block);
    qgemm_step_rows(r.q.data(), r.s.data(), r.sum.data(), rows, in, use == RowsFor::int4_panels, r.step_x.data(), r.step_start.data(),
                    r.step_xs.data());
  }
  return r;
}

void set_problem_rows(QgemmProblem& p, const QuantizedRows& r) {
  if (r.has_split) p.split = r.split.data();
  if (r.has_step) p.step_x = r.step_x.data(), p.step_start = r.step_start.data(), p.step_xs = r.step_xs.data();
}

bool qgemv_integer_path(int64_t in, int64_t group) { return in % kQ8Block == 0 && group % kQ8Block == 0; }

void quantize_rows_q8(const float* x, int64_t rows, int64_t in, int8_t* xq, float* xs) {
  const QuantizedRows& r = quantize_rows(active_kernels(), x, rows, in);
  std::copy_n(r.q.data(), rows * in, xq);
  std::copy_n(r.s.data(), rows * in / kQ8Block, xs);
}

void qgemv_int8(const float* x, int64_t rows, int64_t in, const int8_t* q, const float* scales, int64_t group,
                const float* bias, float* y, int64_t out) {
  const auto& k = active_kernels();
  if (qgemv_integer_path(in, group)) {
    const auto& xr = quantize_rows(k, x, rows, in);
    for_row_groups(out, worth_threads(out * in), [&](int64_t b, int64_t e) {
      k.qgemv_q8x_int8(xr.q.data(), xr.a.data(), xr.s.data(), xr.c.data(), rows, in, q, scales, group, bias, y, out, b, e);
    });
    return;
  }
  for_row_groups(out, worth_threads(out * in), [&](int64_t b, int64_t e) { k.qgemv_int8(x, rows, in, q, scales, group, bias, y, out, b, e); });
}

void qgemv_int4(const float* x, int64_t rows, int64_t in, const uint8_t* q, const float* scales, int64_t group,
                const float* bias, float* y, int64_t out) {
  const auto& k = active_kernels();
  const auto& xr = quantize_rows(k, x, rows, in);   // int4 layers are whole blocks
  for_row_groups(out, worth_threads(out * in / 2), [&](int64_t b, int64_t e) {
    k.qgemv_q8x_int4(xr.q.data(), xr.a.data(), xr.s.data(), xr.c.data(), rows, in, q, scales, group, bias, y, out, b, e);
  });
}

}  // namespace colossal::kernels
