// Calibration for SmoothQuant: a layer factory whose linear layers are the plain dense ones that also
// note, while recording, the largest |x| each input channel has seen. A model built with it loads and
// runs as the fp32 model does; after a pass over calibration text, absmax() gives every linear layer's
// per-channel activation range under its name ("blocks.0.attn.qkv"), which quantize_into turns into
// the smoothing factors.
#pragma once
#include <ATen/core/Tensor.h>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "src/nn/factory.h"
#include "src/nn/model.h"

namespace colossal::quant {

class RecordingLinear;

class CalibrationFactory : public nn::LayerFactory {
 public:
  using nn::LayerFactory::LayerFactory;   // deferred parameters: a calibration pass streaming the blocks
  std::shared_ptr<nn::Linear> linear(const nn::LinearSpec& spec) override;
  void set_recording(bool on);
  // Per linear layer of `model` (built by this factory): max |x| per input channel [in] over what it saw
  // while recording. Error when a layer saw nothing.
  std::map<std::string, at::Tensor> absmax(const nn::Model& model) const;

 private:
  std::vector<std::shared_ptr<RecordingLinear>> layers_;
};

}  // namespace colossal::quant
