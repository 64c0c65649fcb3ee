// Dense-layer products with the per-shape choice between our GEMM and ATen's: see gemm_choice.h.
#include "src/nn/gemm_choice.h"

#include <ATen/ATen.h>
#include <algorithm>
#include <string>

#include "kernels/cpu/gemm.h"
#include "src/nn/kernel_choice.h"

namespace colossal::nn {
namespace {

const float* in(const at::Tensor& t) { return t.const_data_ptr<float>(); }
float* out(const at::Tensor& t) { return t.mutable_data_ptr<float>(); }

std::string shape_of(const char* form, int64_t rows, const at::Tensor& weight) {
  return std::string(form) + " rows=" + std::to_string(rows) + " in=" + std::to_string(weight.size(1)) +
         " out=" + std::to_string(weight.size(0));
}

void ours_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, const at::Tensor& y) {
  const int64_t rows = x.size(0), i = w.size(1), o = w.size(0);
  // B(r, n) = W[n][r]: the weight read transposed, packed per thread by the kernel.
  kernels::gemm({.rows = rows, .cols = o, .depth = i, .a = in(x), .a_row = i, .a_depth = 1, .b = in(w), .b_depth = 1,
                 .b_col = i, .c = out(y), .ldc = o, .bias = b.defined() ? in(b) : nullptr});
}

at::Tensor ours_linear_new(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  auto y = at::empty({x.size(0), w.size(0)}, x.options());
  ours_linear(x, w, b, y);
  return y;
}

void ours_input_grad(const at::Tensor& dy, const at::Tensor& w, const at::Tensor& dx) {
  const int64_t rows = dy.size(0), i = w.size(1), o = w.size(0);
  kernels::gemm({.rows = rows, .cols = i, .depth = o, .a = in(dy), .a_row = o, .a_depth = 1, .b = in(w), .b_depth = i,
                 .b_col = 1, .c = out(dx), .ldc = i});
}

// dy may be a view of the first columns of a wider gradient (its rows dy.stride(0) apart).
void ours_weight_grad(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& into, bool accumulate) {
  const int64_t rows = dy.size(0), i = x.size(1), o = dy.size(1);
  // A(n, m) = dy[m][n]: dy read down its columns (the kernel packs it per tile).
  kernels::gemm({.rows = o, .cols = i, .depth = rows, .a = in(dy), .a_row = 1, .a_depth = dy.stride(0), .b = in(x),
                 .b_depth = i, .b_col = 1, .c = out(into), .ldc = i, .accumulate = accumulate});
}

// The weight gradient is timed on a scratch output of at most this many bytes: past it, on the first
// rows of the output only (the LM head's [V, C] gradient would otherwise add 154 MB at GPT-2's
// vocabulary to the step's peak, in the middle of the backward).
constexpr int64_t kTimingScratchBytes = 16 << 20;

bool choose(const std::string& shape, const std::function<void()>& ours, const std::function<void()>& aten) {
  return use_ours("gemm", kernel_policy().gemm, shape, ours, aten);
}

}  // namespace

bool gemm_applies(const at::Tensor& x, const at::Tensor& weight) {
  return x.is_cpu() && weight.is_cpu() && x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat &&
         weight.dim() == 2 && weight.is_contiguous() && weight.size(0) % kernels::kGemmColumnMultiple == 0 &&
         weight.size(1) % kernels::kGemmColumnMultiple == 0 && weight.size(0) > 0 && weight.size(1) > 0;
}

at::Tensor gemm_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  auto y = at::empty({x.size(0), weight.size(0)}, x.options());
  gemm_linear_into(x, weight, bias, y);
  return y;
}

// ATen's side is what at::linear runs on a 2-D input (addmm with a bias, else mm), into y.
void gemm_linear_into(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, const at::Tensor& y) {
  const auto ours = [&] { ours_linear(x, weight, bias, y); };
  const auto aten = [&] {
    at::Tensor target = y;   // the out= overloads take a non-const reference
    bias.defined() ? (void)at::addmm_out(target, bias, x, weight.t()) : (void)at::mm_out(target, x, weight.t());
  };
  if (choose(shape_of("fwd", x.size(0), weight), ours, aten)) return ours();
  aten();
}

at::Tensor gemm_linear_inference(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  int64_t rows_class = 1;
  while (rows_class < x.size(0)) rows_class *= 2;
  const auto ours = [&] { return ours_linear_new(x, weight, bias); };
  if (use_ours("gemm", kernel_policy().inference_gemm, shape_of("fwd", rows_class, weight), ours, [&] { at::linear(x, weight, bias); }))
    return ours();
  return at::linear(x, weight, bias);
}

at::Tensor gemm_input_grad(const at::Tensor& dy, const at::Tensor& weight) {
  auto ours = [&] {
    auto dx = at::empty({dy.size(0), weight.size(1)}, dy.options());
    ours_input_grad(dy, weight, dx);
    return dx;
  };
  if (choose(shape_of("dx", dy.size(0), weight), ours, [&] { at::mm(dy, weight); })) return ours();
  return at::mm(dy, weight);
}

void gemm_weight_grad(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& into, bool accumulate) {
  const std::string shape = shape_of(accumulate ? "dw+" : "dw", dy.size(0), into);
  std::optional<bool> ours = decided_ours("gemm", kernel_policy().gemm, shape);
  if (!ours) {   // timed on a scratch buffer: the real one holds earlier micro-steps' sums
    const int64_t cap = std::max<int64_t>(16, kTimingScratchBytes / 4 / into.size(1) / 16 * 16);
    const at::Tensor part = dy.narrow(1, 0, std::min(into.size(0), cap));
    auto scratch = at::zeros({part.size(1), into.size(1)}, into.options());
    ours = time_and_choose(
        "gemm", shape, [&] { ours_weight_grad(part, x, scratch, accumulate); },
        [&] { accumulate ? (void)scratch.addmm_(part.t(), x) : (void)at::mm_out(scratch, part.t(), x); });
  }
  if (*ours) return ours_weight_grad(dy, x, into, accumulate);
  at::Tensor target = into;
  if (accumulate) target.addmm_(dy.t(), x);
  else at::mm_out(target, dy.t(), x);
}

at::Tensor grad_buffer_of(const at::Tensor& weight, const at::Tensor& like) {
  const at::Tensor& acc = weight.grad();
  if (weight.is_leaf() && acc.defined() && acc.is_contiguous() && acc.sizes() == weight.sizes() &&
      acc.scalar_type() == like.scalar_type() && acc.device() == like.device())
    return acc;
  return {};
}

at::Tensor gemm_weight_grad_for(const at::Tensor& weight, const at::Tensor& dy, const at::Tensor& x) {
  if (at::Tensor acc = grad_buffer_of(weight, dy); acc.defined()) {
    gemm_weight_grad(dy, x, acc, /*accumulate=*/true);
    return {};
  }
  at::Tensor dw = at::empty_like(weight);
  gemm_weight_grad(dy, x, dw, /*accumulate=*/false);
  return dw;
}

}  // namespace colossal::nn
