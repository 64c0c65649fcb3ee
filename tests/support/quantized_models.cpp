// Quantized test models: see quantized_models.h.
#include "tests/support/quantized_models.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <map>
#include <vector>

#include "src/quant/calibration.h"
#include "src/quant/quantize_model.h"
#include "src/quant/quantized_linear.h"
#include "src/quant/quantized_weight.h"

namespace colossal::test {

ModelConfig tiny_family(const std::string& family) {
  ModelConfig c;
  c.family = family;
  c.n_layer = 2, c.n_head = 2, c.n_embd = 64, c.block_size = 32, c.vocab_size = 512;   // the test tokenizer's pieces
  return c;
}

QuantizedPair quantized_pair(const std::string& family, const quant::QuantConfig& c, bool pack) {
  at::manual_seed(24);
  quant::CalibrationFactory recording;   // a plain fp32 model that can note its layers' input ranges
  auto fp32 = nn::model_as<nn::CausalLM>(build_model(tiny_family(family), recording), "test");
  fp32->eval();
  std::map<std::string, at::Tensor> ranges;
  if (c.scheme == quant::Scheme::int8_smoothquant) {   // calibrated on other ids than the ones compared
    at::NoGradGuard no_grad;
    recording.set_recording(true);
    fp32->forward(at::randint(0, 96, {4, 16}, at::kLong));
    recording.set_recording(false);
    ranges = recording.absmax(*fp32);
  }
  quant::QuantizedLayerFactory qf(c);
  auto quantized = nn::model_as<nn::CausalLM>(build_model(tiny_family(family), qf, /*initialise=*/false), "test");
  quant::quantize_into(*fp32, *quantized, c, &ranges);
  nn::LayerFactory plain;
  auto dequantized = nn::model_as<nn::CausalLM>(build_model(tiny_family(family), plain, /*initialise=*/false), "test");
  at::NoGradGuard no_grad;
  std::map<std::string, at::Tensor> q;
  for (const auto& p : quantized->named_parameters()) q.emplace(p.key(), p.value());
  for (auto& p : dequantized->named_parameters()) {
    const std::string base = p.key().ends_with(".weight") ? p.key().substr(0, p.key().size() - 7) : "";
    if (!base.empty() && q.count(base + ".qweight")) {
      const auto lc = quant::layer_config(c, q.at(base + ".qweight"), q.at(base + ".scales"), q.count(base + ".smooth") > 0);
      auto w = quant::dequantize_weight(q.at(base + ".qweight"), q.at(base + ".scales"), lc, p.value().size(1));
      if (q.count(base + ".smooth")) w = w / q.at(base + ".smooth").view({1, -1});   // SmoothQuant's x / s folded back
      p.value().copy_(w);
    }
    else
      p.value().copy_(q.at(p.key()));
  }
  for (auto* m : {fp32.get(), quantized.get(), dequantized.get()}) m->eval();
  if (pack) qf.pack_for_cpu();   // after the round trip above read the layers' rows
  return {fp32, quantized, dequantized};
}

at::Tensor prefill_then_decode(nn::CausalLM& model, const at::Tensor& ids) {
  auto cache = model.make_cache(ids.size(0), ids.size(1), ids.device());
  nn::ForwardOptions o;
  o.cache = &cache;
  std::vector<at::Tensor> steps{model.forward(ids.narrow(1, 0, 8), o)};
  for (int64_t s = 8; s < ids.size(1); ++s) steps.push_back(model.forward(ids.narrow(1, s, 1), o));
  return at::cat(steps, 1);
}

}  // namespace colossal::test
