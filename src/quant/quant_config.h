// QuantConfig: how a checkpoint's linear layers are quantized, as `colossal quantize` writes it into
// config.json ("quantization_config", beside transformers' own fields: transformers refuses the unknown
// quant_method "colossal" instead of misreading the integers) and as infer and serve read it back.
//
//   int8-weight       int8 weights, one fp32 scale per output channel (group 0) or per `group` inputs
//   int4-weight       int4 weights packed two a byte, one fp32 scale per `group` inputs (default 128)
//   int8-smoothquant  W8A8 (SmoothQuant, Xiao et al. 2023): each layer's input channels scaled by
//                     s_j = max|X_j|^alpha / max|W_j|^(1 - alpha) from a calibration pass, W * s stored
//                     as int8 per output channel, x / s quantized to int8 per token at run time, int8 GEMM
//                     with int32 accumulation; the layer keeps s ("smooth") to divide x by
//
// Scales are symmetric (absmax / 127, absmax / 7), so a weight is q * scale with no zero point. Every
// linear layer of the blocks (and OPT's projections) is quantized; the token embedding, which the tied
// LM head reads too, the position table and the norms stay fp32.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace colossal::quant {

enum class Scheme { int8_weight, int4_weight, int8_smoothquant };

struct QuantConfig {
  Scheme scheme = Scheme::int8_weight;
  int64_t group = 0;   // inputs per scale; 0: one scale per output channel (int8 only)
  double alpha = 0.5;  // SmoothQuant's migration strength (how much of x's range moves into W)
  bool embedding = true;   // the token embedding (the tied head) as int8 rows; false in directories written before it was

  int bits() const { return scheme == Scheme::int4_weight ? 4 : 8; }
  // Inputs per scale of a layer `in` wide: group, or in when per channel.
  int64_t group_for(int64_t in) const { return group > 0 ? group : in; }
};

const char* scheme_name(Scheme s);   // "int8-weight", "int4-weight", "int8-smoothquant"
// Error naming the valid schemes.
Scheme parse_scheme(const std::string& name);
// The scheme's default group: 0 (per channel) for int8, 128 for int4.
int64_t default_group(Scheme s);
// Error when `group` cannot serve `scheme` at all (negative; int4 per channel or not a multiple of 32;
// SmoothQuant other than per channel), saying what would be valid.
void check_group(Scheme scheme, int64_t group);
// Error when a layer of `in` inputs cannot take the config's groups (group must divide in; int4 needs
// in a multiple of 32); `what` names the layer.
void check_layer(const QuantConfig& c, int64_t in, const std::string& what);

nlohmann::json to_json(const QuantConfig& c);
// config.json's "quantization_config" when it is ours; nullopt when absent; Error naming `path` when it
// is another method's or malformed.
std::optional<QuantConfig> quant_config_of(const nlohmann::json& config, const std::string& path);

}  // namespace colossal::quant
