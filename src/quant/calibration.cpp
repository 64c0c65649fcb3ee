// SmoothQuant's calibration pass: see calibration.h.
#include "src/quant/calibration.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "src/core/error.h"
#include "src/nn/linear_forward.h"

namespace colossal::quant {

class RecordingLinear : public nn::Linear {
 public:
  RecordingLinear(const nn::LinearSpec& s, const nn::LayerFactory& f) {
    weight_ = register_parameter("weight", f.parameter({s.out, s.in}));
    if (s.bias) bias_ = register_parameter("bias", f.parameter({s.out}));
    absmax_ = at::zeros({s.in});
  }
  at::Tensor forward(const at::Tensor& x) override {
    if (recording) {
      at::NoGradGuard no_grad;
      absmax_ = at::maximum(absmax_, x.detach().reshape({-1, x.size(-1)}).abs().amax(0).to(at::kFloat).cpu());
    }
    return nn::linear_forward(x, weight_, bias_);
  }
  at::Tensor& weight() override { return weight_; }
  const at::Tensor& absmax() const { return absmax_; }
  bool recording = false;

 private:
  at::Tensor weight_, bias_, absmax_;
};

std::shared_ptr<nn::Linear> CalibrationFactory::linear(const nn::LinearSpec& spec) {
  layers_.push_back(std::make_shared<RecordingLinear>(spec, *this));
  return layers_.back();
}

void CalibrationFactory::set_recording(bool on) {
  for (auto& l : layers_) l->recording = on;
}

std::map<std::string, at::Tensor> CalibrationFactory::absmax(const nn::Model& model) const {
  std::map<const void*, std::string> names;   // a layer's weight -> its name, found by identity
  for (const auto& p : model.named_parameters())
    if (p.key().ends_with(".weight")) names[p.value().unsafeGetTensorImpl()] = p.key().substr(0, p.key().size() - 7);
  std::map<std::string, at::Tensor> out;
  for (const auto& l : layers_) {
    auto it = names.find(l->weight().unsafeGetTensorImpl());
    if (it == names.end()) continue;   // a layer of another model
    if (!(l->absmax() > 0).any().item<bool>()) throw Error("calibration: layer " + it->second + " saw no input (is the calibration text empty?)");
    out[it->second] = l->absmax();
  }
  return out;
}

}  // namespace colossal::quant
