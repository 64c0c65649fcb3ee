// QuantizedLinear: a linear layer whose weight is stored quantized (quant_config.h), for inference.
// Parameters: "qweight" (int8 [out, in] or packed int4 uint8 [out, in / 2]), "scales" (fp32
// [out, in / group]), "bias", and for int8-smoothquant "smooth" (fp32 [in], x is divided by it); none
// records a gradient. Decoding rows (x [B, 1, in], B <= 16) go through kernels/cpu/qgemv's integer dot
// products; longer inputs (the prefill) go through kernels/cpu/gemm with the weight dequantized block by
// block as the GEMM packs it (never a whole fp32 copy), or under SmoothQuant through an int8 GEMM with x
// quantized per token.
//
// QuantizedLayerFactory builds models whose every linear layer is one of these, so `colossal infer`
// and `serve` load a quantized checkpoint into the same model classes as an fp32 one.
#pragma once
#include <memory>

#include "src/nn/factory.h"
#include "src/quant/quant_config.h"

namespace colossal::quant {

class QuantizedLinear : public nn::Linear {
 public:
  // Error when `in` cannot take the config's groups (check_layer).
  QuantizedLinear(const nn::LinearSpec& spec, const QuantConfig& config);
  at::Tensor forward(const at::Tensor& x) override;   // [..., in] -> [..., out]
  at::Tensor& weight() override { return qweight_; }  // the integers
  const at::Tensor& scales() const { return scales_; }
  const QuantConfig& config() const { return config_; }
  int64_t in_features() const { return in_; }
  // The fp32 weight [out, in] the integers stand for (SmoothQuant's factors divided back out).
  at::Tensor dequantized() const;

 private:
  at::Tensor smoothquant_gemm(const at::Tensor& x_smoothed) const;
  at::Tensor dequantizing_gemm(const at::Tensor& x) const;
  QuantConfig config_;
  int64_t in_ = 0;
  at::Tensor qweight_, scales_, bias_;
  at::Tensor smooth_;   // int8-smoothquant: x is divided by it (s per input channel)
};

class QuantizedLayerFactory : public nn::LayerFactory {
 public:
  explicit QuantizedLayerFactory(QuantConfig config) : config_(config) {}
  std::shared_ptr<nn::Linear> linear(const nn::LinearSpec& spec) override;
  const QuantConfig& config() const { return config_; }
  int64_t layers() const { return layers_; }   // linear layers built so far

 private:
  QuantConfig config_;
  int64_t layers_ = 0;
};

}  // namespace colossal::quant
