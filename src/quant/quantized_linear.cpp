// Quantized linear layer and its factory: see quantized_linear.h.
#include "src/quant/quantized_linear.h"

#include <ATen/ATen.h>

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
}

at::Tensor QuantizedLinear::dequantized() const { return dequantize_weight(qweight_, scales_, config_, in_); }

at::Tensor QuantizedLinear::forward(const at::Tensor& x) {
  const int64_t out = qweight_.size(0);
  const bool decoding = x.is_cpu() && qweight_.is_cpu() && x.scalar_type() == at::kFloat && x.dim() >= 2 && x.size(-2) == 1 &&
                        x.size(-1) == in_ && x.numel() / in_ <= kQgemvMaxRows;
  if (!decoding) return nn::linear_forward(x, dequantized().to(x.device(), x.scalar_type()),
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
