// Quantization schemes and their config.json entry: see quant_config.h.
#include "src/quant/quant_config.h"

#include "kernels/cpu/qgemv.h"
#include "src/core/error.h"

namespace colossal::quant {

const char* scheme_name(Scheme s) {
  return s == Scheme::int4_weight ? "int4-weight" : s == Scheme::int8_smoothquant ? "int8-smoothquant" : "int8-weight";
}

Scheme parse_scheme(const std::string& name) {
  if (name == "int8-weight") return Scheme::int8_weight;
  if (name == "int4-weight") return Scheme::int4_weight;
  if (name == "int8-smoothquant") return Scheme::int8_smoothquant;
  throw Error("unknown quantization scheme \"" + name + "\" (valid: int8-weight, int4-weight, int8-smoothquant)");
}

int64_t default_group(Scheme s) { return s == Scheme::int4_weight ? 128 : 0; }

void check_group(Scheme scheme, int64_t group) {
  if (group < 0) throw Error("group size " + std::to_string(group) + " is negative (valid: 0 for one scale per output channel with int8, or a positive multiple of 32)");
  if (scheme == Scheme::int8_smoothquant && group != 0)
    throw Error("int8-smoothquant scales each output channel once (its activations take per-token scales); drop --group-size or give 0");
  if (scheme == Scheme::int4_weight && (group == 0 || group % kernels::kInt4Block != 0))
    throw Error("int4-weight needs a group size that is a positive multiple of 32 (got " + std::to_string(group) +
                "; try 32, 64 or 128)");
}

void check_layer(const QuantConfig& c, int64_t in, const std::string& what) {
  const int64_t g = c.group_for(in);
  if (in % g != 0)
    throw Error(what + " has " + std::to_string(in) + " inputs, which groups of " + std::to_string(g) +
                " do not divide (choose a group size that divides every linear layer's input width, or 0 for per-channel int8)");
  if (c.scheme == Scheme::int4_weight && in % kernels::kInt4Block != 0)
    throw Error(what + " has " + std::to_string(in) + " inputs; int4-weight packs inputs in blocks of 32");
}

nlohmann::json to_json(const QuantConfig& c) {
  nlohmann::json j = {{"quant_method", "colossal"}, {"scheme", scheme_name(c.scheme)}, {"bits", c.bits()}, {"group_size", c.group},
                      {"symmetric", true}, {"modules", "linear layers and the token embedding (the tied head)"},
                      {"embedding", c.embedding ? "int8 rows" : "fp32"}};
  if (c.scheme == Scheme::int8_smoothquant) j["alpha"] = c.alpha, j["activations"] = "int8 per token, dynamic";
  return j;
}

std::optional<QuantConfig> quant_config_of(const nlohmann::json& config, const std::string& path) {
  auto it = config.find("quantization_config");
  if (it == config.end() || it->is_null()) return std::nullopt;
  const auto& q = *it;
  const std::string where = path + ": quantization_config";
  if (!q.is_object()) throw Error(where + " is not an object");
  const std::string method = q.value("quant_method", std::string());
  if (method != "colossal")
    throw Error(where + " names quant_method \"" + method + "\"; colossal reads only its own (colossal quantize writes them)");
  if (!q.contains("scheme") || !q["scheme"].is_string()) throw Error(where + ": \"scheme\" is missing or not a string");
  if (!q.contains("group_size") || !q["group_size"].is_number_integer()) throw Error(where + ": \"group_size\" is missing or not an integer");
  QuantConfig c;
  try {
    c.scheme = parse_scheme(q["scheme"].get<std::string>());
    c.group = q["group_size"].get<int64_t>();
    check_group(c.scheme, c.group);
    if (q.contains("alpha") && q["alpha"].is_number()) c.alpha = q["alpha"].get<double>();
    c.embedding = q.value("embedding", nlohmann::json("fp32")) == "int8 rows";
  } catch (const Error& e) {
    throw Error(where + ": " + e.what());
  }
  return c;
}

}  // namespace colossal::quant
