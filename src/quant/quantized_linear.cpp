// Quantized linear layer and its factory: see quantized_linear.h.
#include "src/quant/quantized_linear.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/qgemv.h"
#include "src/nn/linear_forward.h"
#include "src/quant/quantized_weight.h"

namespace colossal::quant {
namespace {

constexpr int64_t kQgemvMaxRows = 16;   // beyond this many rows the dequantized GEMM reads less per output

}  // namespace

QuantizedLinear::QuantizedLinear(const nn::LinearSpec& spec, const QuantConfig& config) : config_(config), in_(spec.in) {
  check_layer(config, spec.in, "a linear layer of " + std::to_string(spec.in) + " x " + std::to_string(spec.out));
  const auto dtype = config.scheme == Scheme::int4_weight ? at::kByte : at::kChar;
  qweight_ = register_parameter("qweight", at::zeros(q_shape(config, spec.out, spec.in), dtype), /*requires_grad=*/false);
  scales_ = register_parameter("scales", at::zeros(scales_shape(config, spec.out, spec.in)), /*requires_grad=*/false);
  if (spec.bias) bias_ = register_parameter("bias", at::zeros({spec.out}), /*requires_grad=*/false);
  if (config.scheme == Scheme::int8_smoothquant) smooth_ = register_parameter("smooth", at::ones({spec.in}), /*requires_grad=*/false);
}

at::Tensor QuantizedLinear::dequantized() const {
  const auto w = dequantize_weight(qweight_, scales_, config_, in_);
  return smooth_.defined() ? w / smooth_.view({1, -1}) : w;
}

// The prefill: our GEMM with the weight dequantized as its blocks are packed (gemm.h's GemmQuantizedB).
at::Tensor QuantizedLinear::dequantizing_gemm(const at::Tensor& x) const {
  const auto x2 = x.reshape({-1, in_}).contiguous();                                    // [M, in]
  const int64_t out = qweight_.size(0);
  auto y = at::empty({x2.size(0), out}, x.options());
  const kernels::GemmQuantizedB qb{qweight_.const_data_ptr(), scales_.const_data_ptr<float>(), config_.group_for(in_),
                                   config_.scheme == Scheme::int4_weight};
  kernels::GemmProblem p{.rows = x2.size(0), .cols = out, .depth = in_, .a = x2.const_data_ptr<float>(), .a_row = in_, .a_depth = 1,
                         .b = nullptr, .b_depth = 1, .b_col = in_, .c = y.mutable_data_ptr<float>(), .ldc = out,
                         .bias = bias_.defined() ? bias_.const_data_ptr<float>() : nullptr};
  p.quantized_b = &qb;
  kernels::gemm(p);
  auto sizes = x.sizes().vec();
  sizes.back() = out;
  return y.view(sizes);
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
  const int64_t out = qweight_.size(0);
  const at::Tensor x = smooth_.defined() ? x_in / smooth_.to(x_in.device(), x_in.scalar_type()) : x_in;   // SmoothQuant's x / s
  const bool decoding = x.is_cpu() && qweight_.is_cpu() && x.scalar_type() == at::kFloat && x.dim() >= 2 && x.size(-2) == 1 &&
                        x.size(-1) == in_ && x.numel() / in_ <= kQgemvMaxRows;
  if (!decoding && smooth_.defined() && x.is_cpu() && !at::GradMode::is_enabled()) return smoothquant_gemm(x);
  if (!decoding && x.is_cpu() && qweight_.is_cpu() && x.scalar_type() == at::kFloat && !at::GradMode::is_enabled() &&
      out % kernels::kGemmColumnMultiple == 0 && x.numel() > 0)
    return dequantizing_gemm(x);
  if (!decoding) return nn::linear_forward(x, dequantize_weight(qweight_, scales_, config_, in_).to(x.device(), x.scalar_type()),
                                           bias_.defined() ? bias_.to(x.device(), x.scalar_type()) : at::Tensor());
  auto xc = x.contiguous();
  auto sizes = x.sizes().vec();
  sizes.back() = out;
  auto y = at::empty(sizes, x.options());
  const int64_t rows = xc.numel() / in_, group = config_.group_for(in_);
  const float* b = bias_.defined() ? bias_.const_data_ptr<float>() : nullptr;
  if (config_.scheme == Scheme::int4_weight)
    kernels::qgemv_int4(xc.const_data_ptr<float>(), rows, in_, qweight_.const_data_ptr<uint8_t>(), scales_.const_data_ptr<float>(),
                        group, b, y.mutable_data_ptr<float>(), out);
  else
    kernels::qgemv_int8(xc.const_data_ptr<float>(), rows, in_, qweight_.const_data_ptr<int8_t>(), scales_.const_data_ptr<float>(),
                        group, b, y.mutable_data_ptr<float>(), out);
  return y;
}

std::shared_ptr<nn::Linear> QuantizedLayerFactory::linear(const nn::LinearSpec& spec) {
  ++layers_;
  return std::make_shared<QuantizedLinear>(spec, config_);
}

}  // namespace colossal::quant
