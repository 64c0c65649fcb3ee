// A quantized model's values from its fp32 twin: see quantize_model.h.
#include "src/quant/quantize_model.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <map>

#include "src/core/error.h"
#include "src/quant/quantized_weight.h"

namespace colossal::quant {

void quantize_into(const nn::Model& source, nn::Model& quantized, const QuantConfig& c) {
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
    if (name.ends_with(".scales")) continue;   // with its qweight
    if (!name.ends_with(qsuffix)) {
      value.copy_(from(name));
      continue;
    }
    const std::string base = name.substr(0, name.size() - qsuffix.size());
    const auto q = quantize_weight(from(base + ".weight"), c);
    value.copy_(q.q);
    dst.at(base + ".scales").copy_(q.scales);
  }
}

}  // namespace colossal::quant
