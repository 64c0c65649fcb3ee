// A quantized model's values from its fp32 twin: see quantize_model.h.
#include "src/quant/quantize_model.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <map>

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

void quantize_into(const nn::Model& source, nn::Model& quantized, const QuantConfig& model_config,
                   const std::map<std::string, at::Tensor>* act_absmax) {
  std::map<std::string, at::Tensor> src, dst;
  for (const auto& p : source.named_parameters()) src.emplace(p.key(), p.value());
  for (const auto& p : quantized.named_parameters()) dst.emplace(p.key(), p.value());
  auto from = [&](const std::string& name) -> const at::Tensor& {
    auto it = src.find(name);
    if (it == src.end()) throw Error("quantize: the source model has no \"" + name + "\" (a model of another config?)");
    return it->second;
  };
  const std::string qsuffix = ".qweight";
  at::NoGradGuard no_grad;
  for (const auto& [name, value] : dst) {
    if (name.ends_with(".scales") || name.ends_with(".smooth")) continue;   // with its qweight
    if (!name.ends_with(qsuffix)) {
      value.copy_(from(name));
      continue;
    }
    const std::string base = name.substr(0, name.size() - qsuffix.size());
    const QuantConfig c = layer_config(model_config, value, dst.at(base + ".scales"), dst.count(base + ".smooth") > 0);
    at::Tensor w = from(base + ".weight");
    if (c.scheme == Scheme::int8_smoothquant) {
      if (!act_absmax || !act_absmax->count(base)) throw Error("quantize: int8-smoothquant has no calibration range for " + base);
      const auto s = smoothing_factors(act_absmax->at(base), w, c.alpha);
      w = w * s.view({1, -1});   // x / s times W * s is x W: the activations' outliers move into the weights
      dst.at(base + ".smooth").copy_(s);
    }
    const auto q = quantize_weight(w, c);
    value.copy_(q.q);
    dst.at(base + ".scales").copy_(q.scales);
  }
}

}  // namespace colossal::quant
