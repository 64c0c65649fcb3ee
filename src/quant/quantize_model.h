// Filling a model built by a QuantizedLayerFactory from the fp32 model of the same config: each
// quantized layer's integers and scales from the fp32 weight of the same name, every other tensor
// copied. `colossal quantize` and the tests build quantized models this way.
#pragma once
#include "src/nn/model.h"
#include "src/quant/quant_config.h"

namespace colossal::quant {

void quantize_into(const nn::Model& source, nn::Model& quantized, const QuantConfig& config);

}  // namespace colossal::quant
