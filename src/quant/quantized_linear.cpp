// Quantized linear layer and its factory: see quantized_linear.h.
#include "src/quant/quantized_linear.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/qgemm.h"
#include "kernels/cpu/qgemv.h"
#include "src/nn/linear_forward.h"
#include "src/quant/quantized_weight.h"

namespace colossal::quant {
namespace {

constexpr int64_t kQgemvMaxRows = 16;   // beyond this many rows the dequantized GEMM reads less per output

// x [..., 1, in] with at most kQgemvMaxRows rows: one new token of a few sequences (the decoding GEMV's shape).
bool decoding_rows(const at::Tensor& x, int64_t in) {
  return x.dim() >= 2 && x.size(-2) == 1 && x.size(-1) == in && x.numel() / in <= kQgemvMaxRows;
}

}  // namespace

QuantizedLinear::QuantizedLinear(const nn::LinearSpec& spec, const QuantConfig& config) : config_(config), in_(spec.in) {
  check_layer(config, spec.in, "a linear layer of " + std::to_string(spec.in) + " x " + std::to_string(spec.out));
  const auto dtype = config.scheme == Scheme::int4_weight ? at::kByte : at::kChar;
  qweight_ = register_parameter("qweight", at::zeros(q_shape(config, spec.out, spec.in), dtype), /*requires_grad=*/false);
  scales_ = register_parameter("scales", at::zeros(scales_shape(config, spec.out, spec.in)), /*requires_grad=*/false);
  if (spec.bias) bias_ = register_parameter("bias", at::zeros({spec.out}), /*requires_grad=*/false);
  if (config.scheme == Scheme::int8_smoothquant) smooth_ = register_parameter("smooth", at::ones({spec.in}), /*requires_grad=*/false);
}

namespace {

// The integer kernels, which multiply by the stored integers directly: the decoding GEMV (qgemv.h) for
// a decoding step's rows, or where the CPU has VNNI the prompt GEMM (qgemm.h) for a prompt's; both
// round x alike. Their signatures are the same, so one call serves both.
at::Tensor integer_kernel(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scales, const QuantConfig& c, int64_t in,
                          const at::Tensor& bias, bool prompt) {
  const auto x2 = x.reshape({-1, in}).contiguous();                                     // [M, in]
  const int64_t out = q.size(0), group = c.group_for(in);
  auto y = at::empty({x2.size(0), out}, x.options());
  const float* b = bias.defined() ? bias.const_data_ptr<float>() : nullptr;
  if (c.scheme == Scheme::int4_weight)
    (prompt ? kernels::qgemm_int4 : kernels::qgemv_int4)(x2.const_data_ptr<float>(), x2.size(0), in, q.const_data_ptr<uint8_t>(),
                                                         scales.const_data_ptr<float>(), group, b, y.mutable_data_ptr<float>(), out);
  else
    (prompt ? kernels::qgemm_int8 : kernels::qgemv_int8)(x2.const_data_ptr<float>(), x2.size(0), in, q.const_data_ptr<int8_t>(),
                                                         scales.const_data_ptr<float>(), group, b, y.mutable_data_ptr<float>(), out);
  auto sizes = x.sizes().vec();
  sizes.back() = out;
  return y.view(sizes);
}

// The prefill elsewhere: our GEMM with the weight dequantized as its blocks are packed (gemm.h's GemmQuantizedB).
at::Tensor dequantizing_gemm(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scales, const QuantConfig& c, int64_t in,
                             const at::Tensor& bias) {
  const auto x2 = x.reshape({-1, in}).contiguous();                                     // [M, in]
  const int64_t out = q.size(0);
  auto y = at::empty({x2.size(0), out}, x.options());
  const kernels::GemmQuantizedB qb{q.const_data_ptr(), scales.const_data_ptr<float>(), c.group_for(in), c.scheme == Scheme::int4_weight};
  kernels::GemmProblem p{.rows = x2.size(0), .cols = out, .depth = in, .a = x2.const_data_ptr<float>(), .a_row = in, .a_depth = 1,
                         .b = nullptr, .b_depth = 1, .b_col = in, .c = y.mutable_data_ptr<float>(), .ldc = out,
                         .bias = bias.defined() ? bias.const_data_ptr<float>() : nullptr};
  p.quantized_b = &qb;
  kernels::gemm(p);
  auto sizes = x.sizes().vec();
  sizes.back() = out;
  return y.view(sizes);
}

}  // namespace

at::Tensor quantized_matmul(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scales, const QuantConfig& c, int64_t in,
                            const at::Tensor& bias) {
  const int64_t out = q.size(0);
  const bool cpu_float = x.is_cpu() && q.is_cpu() && x.scalar_type() == at::kFloat && !at::GradMode::is_enabled();
  if (cpu_float && decoding_rows(x, in)) return integer_kernel(x, q, scales, c, in, bias, /*prompt=*/false);
  if (cpu_float && x.numel() > 0 && kernels::qgemm_available(in, c.group_for(in))) return integer_kernel(x, q, scales, c, in, bias, /*prompt=*/true);
  const int64_t gemm_rows = out / kernels::kGemmColumnMultiple * kernels::kGemmColumnMultiple;
  if (cpu_float && gemm_rows == out && x.numel() > 0) return dequantizing_gemm(x, q, scales, c, in, bias);
  if (cpu_float && gemm_rows > 0 && x.numel() > 0) {
    // A row count the GEMM's columns cannot take whole (a vocabulary of 50257): the GEMM for all but the
    // last < 16 rows, those few dequantized, rather than the whole weight dequantized for every call.
    auto part = [&](const at::Tensor& t, int64_t from, int64_t n) { return t.defined() ? t.narrow(0, from, n) : t; };
    const int64_t rest = out - gemm_rows;
    const at::Tensor head = dequantizing_gemm(x, q.narrow(0, 0, gemm_rows), scales.narrow(0, 0, gemm_rows), c, in, part(bias, 0, gemm_rows));
    const at::Tensor tail = nn::linear_forward(x, dequantize_weight(q.narrow(0, gemm_rows, rest), scales.narrow(0, gemm_rows, rest), c, in),
                                               part(bias, gemm_rows, rest));
    return at::cat({head, tail}, -1);
  }
  // other devices, an empty x, or a gradient to record
  return nn::linear_forward(x, dequantize_weight(q, scales, c, in).to(x.device(), x.scalar_type()),
                            bias.defined() ? bias.to(x.device(), x.scalar_type()) : at::Tensor());
}

// W8A8: x / s quantized to int8 per token (absmax / 127), an int8 GEMM summing in int32 (ATen's _int_mm:
// oneDNN's VNNI kernels on CPU), then both scales and the bias.
at::Tensor QuantizedLinear::smoothquant_gemm(const at::Tensor& xs) const {
  auto x2 = xs.reshape({-1, in_}).to(at::kFloat);                                        // [M, in]
  const auto sx = x2.abs().amax(1, /*keepdim=*/true) / 127.0f;                           // [M, 1]
  const auto xq = (x2 / at::where(sx > 0, sx, at::ones_like(sx))).round_().clamp_(-127, 127).to(at::kChar);
  auto y = at::_int_mm(xq, qweight_.t()).to(at::kFloat).mul_(sx).mul_(scales_.view({1, -1}));   // [M, out]
  if (bias_.defined()) y.add_(bias_);
  auto sizes = xs.sizes().vec();
  sizes.back() = qweight_.size(0);
  return y.view(sizes);
}

at::Tensor QuantizedLinear::forward(const at::Tensor& x_in) {
  if (!smooth_.defined()) return quantized_matmul(x_in, qweight_, scales_, config_, in_, bias_);
  const at::Tensor x = x_in / smooth_.to(x_in.device(), x_in.scalar_type());   // SmoothQuant's x / s
  if (!decoding_rows(x, in_) && x.is_cpu() && !at::GradMode::is_enabled()) return smoothquant_gemm(x);
  return quantized_matmul(x, qweight_, scales_, config_, in_, bias_);
}

QuantizedEmbedding::QuantizedEmbedding(int64_t num, int64_t dim) {
  qweight_ = register_parameter("qweight", at::zeros({num, dim}, at::kChar), /*requires_grad=*/false);
  scales_ = register_parameter("scales", at::zeros({num, 1}), /*requires_grad=*/false);
}

at::Tensor QuantizedEmbedding::forward(const at::Tensor& ids) {
  const auto flat = ids.reshape({-1});
  auto rows = qweight_.index_select(0, flat).to(at::kFloat).mul_(scales_.index_select(0, flat));   // [N, dim]
  auto sizes = ids.sizes().vec();
  sizes.push_back(qweight_.size(1));
  return rows.view(sizes);
}

at::Tensor QuantizedEmbedding::project(const at::Tensor& x) { return quantized_matmul(x, qweight_, scales_, config(), qweight_.size(1), {}); }

std::shared_ptr<nn::Linear> QuantizedLayerFactory::linear(const nn::LinearSpec& spec) {
  ++layers_;
  return std::make_shared<QuantizedLinear>(spec, config_);
}

std::shared_ptr<nn::Embedding> QuantizedLayerFactory::embedding(int64_t num, int64_t dim, nn::Split split) {
  if (split != nn::Split::Vocab || !config_.embedding) return LayerFactory::embedding(num, dim, split);   // positions: small
  ++embeddings_;
  return std::make_shared<QuantizedEmbedding>(num, dim);
}

}  // namespace colossal::quant
