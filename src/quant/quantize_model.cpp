// A quantized model's values from its fp32 twin: see quantize_model.h.
#include "src/quant/quantize_model.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <map>
#include <string_view>

#include "src/core/error.h"
#include "src/quant/quantized_weight.h"

namespace colossal::quant {

at::Tensor smoothing_factors(const at::Tensor& act_absmax, const at::Tensor& weight, double alpha) {
  const auto a = act_absmax.to(at::kFloat), w = weight.to(at::kFloat).abs().amax(0);   // [in] each
  const auto s = a.pow(alpha) / w.pow(1.0 - alpha);
  return at::where((a > 0) & (w > 0), s.clamp(1e-5, 1e5), at::ones_like(s));
}

QuantConfig layer_config(const QuantConfig& model_config, const at::Tensor& q, const at::Tensor& scales, bool smoothed) {
  QuantConfig c = model_config;
  const int64_t in = q.scalar_type() == at::kByte ? 2 * q.size(1) : q.size(1), groups = scales.size(1);
  c.scheme = q.scalar_type() == at::kByte ? Scheme::int4_weight : smoothed ? Scheme::int8_smoothquant : Scheme::int8_weight;
  c.group = groups == 1 && c.scheme != Scheme::int4_weight ? 0 : in / groups;
  return c;
}

QuantizedParams quantized_params(const nn::Model& quantized) {
  QuantizedParams out;
  for (const auto& p : quantized.named_parameters()) out.emplace(p.key(), p.value());
  return out;
}

namespace {
constexpr std::string_view kWeight = ".weight";
// The quantized layer a source weight belongs to ("h.0.mlp.fc" for "h.0.mlp.fc.weight"), or "".
std::string quantized_layer(const std::string& name, const QuantizedParams& quantized) {
  if (!name.ends_with(kWeight)) return "";
  std::string base = name.substr(0, name.size() - kWeight.size());
  return quantized.count(base + ".qweight") ? base : "";
}
}  // namespace

std::vector<std::string> quantized_names(const std::string& name, const QuantizedParams& quantized) {
  if (quantized.count(name)) return {name};
  const std::string base = quantized_layer(name, quantized);
  if (base.empty()) throw Error("quantize: the quantized model has no place for \"" + name + "\" (a model of another config?)");
  std::vector<std::string> out = {base + ".qweight", base + ".scales"};
  if (quantized.count(base + ".smooth")) out.push_back(base + ".smooth");
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> quantize_parameter(const std::string& name, const at::Tensor& value,
                                                                   const QuantizedParams& quantized, const QuantConfig& model_config,
                                                                   const std::map<std::string, at::Tensor>* act_absmax) {
  at::NoGradGuard no_grad;
  const auto names = quantized_names(name, quantized);
  if (names.size() == 1) return {{name, value.to(quantized.at(name).scalar_type())}};
  const std::string base = quantized_layer(name, quantized);
  const bool smoothed = names.size() == 3;
  const QuantConfig c = layer_config(model_config, quantized.at(base + ".qweight"), quantized.at(base + ".scales"), smoothed);
  at::Tensor w = value.to(at::kFloat);
  std::vector<std::pair<std::string, at::Tensor>> out;
  at::Tensor s;
  if (smoothed) {
    if (!act_absmax || !act_absmax->count(base)) throw Error("quantize: int8-smoothquant has no calibration range for " + base);
    s = smoothing_factors(act_absmax->at(base), w, c.alpha);
    w = w * s.view({1, -1});   // x / s times W * s is x W: the activations' outliers move into the weights
  }
  const auto q = quantize_weight(w, c);
  out.emplace_back(base + ".qweight", q.q);
  out.emplace_back(base + ".scales", q.scales);
  if (smoothed) out.emplace_back(base + ".smooth", s);
  return out;
}

void quantize_into(const nn::Model& source, nn::Model& quantized, const QuantConfig& model_config,
                   const std::map<std::string, at::Tensor>* act_absmax) {
  const QuantizedParams dst = quantized_params(quantized);
  size_t filled = 0;
  at::NoGradGuard no_grad;
  for (const auto& p : source.named_parameters())
    for (const auto& [name, value] : quantize_parameter(p.key(), p.value(), dst, model_config, act_absmax)) {
      dst.at(name).copy_(value);
      ++filled;
    }
  if (filled != dst.size())
    throw Error("quantize: " + std::to_string(dst.size() - filled) + " of the quantized model's tensors have no source (a model of another config?)");
}

}  // namespace colossal::quant
