// Filling a model built by a QuantizedLayerFactory from the fp32 model of the same config: each
// quantized layer's integers and scales from the fp32 weight of the same name, every other tensor
// copied. `colossal quantize` and the tests build quantized models this way; quantize_parameter does the
// same one source tensor at a time, for a model that is never whole in memory.
// int8-smoothquant needs `act_absmax`, each linear layer's per-channel input range from a calibration pass
// (calibration.h): the layer's smoothing factors s come from it and from the weight's own range.
#pragma once
#include <ATen/core/Tensor.h>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "src/nn/model.h"
#include "src/quant/quant_config.h"

namespace colossal::quant {

// The quantized model's parameters by name (their shapes and types: deferred parameters will do).
using QuantizedParams = std::map<std::string, at::Tensor>;
QuantizedParams quantized_params(const nn::Model& quantized);

// The names of the quantized model's tensors that the source parameter `name` becomes, in a fixed order:
// the name itself where it is kept as it is, else its layer's qweight and scales (and smooth). Error
// when the quantized model has no place for it.
std::vector<std::string> quantized_names(const std::string& name, const QuantizedParams& quantized);
// Those tensors' values from the source parameter's fp32 `value`, in quantized_names' order.
std::vector<std::pair<std::string, at::Tensor>> quantize_parameter(const std::string& name, const at::Tensor& value,
                                                                   const QuantizedParams& quantized, const QuantConfig& config,
                                                                   const std::map<std::string, at::Tensor>* act_absmax);

void quantize_into(const nn::Model& source, nn::Model& quantized, const QuantConfig& config,
                   const std::map<std::string, at::Tensor>* act_absmax = nullptr);

// The layout a quantized model's tensor pair holds, read from its shapes and dtype (a model's layers may
// differ: the tied head is int8 per row whatever the scheme): int4 when packed (uint8), SmoothQuant when
// the layer has a smoothing vector (alpha taken from `model_config`), else int8 with the scales' groups.
QuantConfig layer_config(const QuantConfig& model_config, const at::Tensor& qweight, const at::Tensor& scales, bool smoothed);

// SmoothQuant's factors for a layer: s_j = max|X_j|^alpha / max|W_j|^(1 - alpha), 1 where either is 0.
at::Tensor smoothing_factors(const at::Tensor& act_absmax, const at::Tensor& weight, double alpha);

}  // namespace colossal::quant
