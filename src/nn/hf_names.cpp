// HF name mapping: see hf_names.h.
#include "src/nn/hf_names.h"

#include <cctype>

#include "src/core/error.h"

namespace colossal::nn {
namespace {

// Matches `name` against `pattern` ("*" = one run of digits) as a prefix followed by "." or the end.
// On success returns the block index captured (or "") and the rest of the name after the prefix.
bool match_prefix(const std::string& pattern, const std::string& name, std::string& index, std::string& rest) {
  size_t p = 0, n = 0;
  index.clear();
  while (p < pattern.size()) {
    if (pattern[p] == '*') {
      size_t start = n;
      while (n < name.size() && std::isdigit(static_cast<unsigned char>(name[n]))) ++n;
      if (n == start) return false;
      index = name.substr(start, n - start);
      ++p;
    } else {
      if (n >= name.size() || name[n] != pattern[p]) return false;
      ++p, ++n;
    }
  }
  if (n != name.size() && name[n] != '.') return false;
  rest = name.substr(n);
  return true;
}

std::string fill(const std::string& pattern, const std::string& index) {
  std::string out = pattern;
  auto star = out.find('*');
  if (star != std::string::npos) out.replace(star, 1, index);
  return out;
}

bool glob(const std::string& pattern, const std::string& name) {
  std::string index, rest;
  return match_prefix(pattern, name, index, rest) && rest.empty();
}

}  // namespace

HfNameMap::HfNameMap(std::vector<HfNameRule> rules, std::vector<std::string> ignored_on_import, std::string base_prefix)
    : rules_(std::move(rules)), ignored_(std::move(ignored_on_import)), base_prefix_(std::move(base_prefix)) {}

HfTarget HfNameMap::to_hf(const std::string& ours) const {
  std::string index, rest;
  for (const auto& r : rules_) {
    if (!match_prefix(r.ours, ours, index, rest)) continue;
    const std::string base = fill(r.hf, index);
    if (rest == ".smooth")   // indexed by input channel, which every part shares: once, whole, no row reordering
      return HfTarget{{base + (r.parts.empty() ? "" : "." + r.parts.front()) + rest}, false, 0};
    HfTarget t{{}, r.transpose && rest == ".weight", r.interleave_heads};
    if (r.parts.empty()) t.names.push_back(base + rest);
    for (const auto& part : r.parts) t.names.push_back(base + "." + part + rest);
    return t;
  }
  throw Error("no Hugging Face name for parameter \"" + ours + "\"");
}

std::string HfNameMap::canonical(const std::string& name) const {
  // Checkpoints from TensorFlow-era conversions (bert-base-uncased among them) name LayerNorm
  // parameters gamma and beta; transformers reads them as weight and bias, and so do we.
  std::string hf = name;
  for (auto [old_suffix, new_suffix] : {std::pair{".gamma", ".weight"}, {".beta", ".bias"}})
    if (hf.size() > std::string(old_suffix).size() && hf.ends_with(old_suffix))
      hf = hf.substr(0, hf.size() - std::string(old_suffix).size()) + new_suffix;
  if (base_prefix_.empty() || hf.rfind(base_prefix_, 0) == 0 || match(hf)) return hf;
  return match(base_prefix_ + hf) || ignored(base_prefix_ + hf) ? base_prefix_ + hf : hf;
}

std::optional<HfSource> HfNameMap::match(const std::string& hf) const {
  std::string index, rest;
  for (const auto& r : rules_) {
    if (r.parts.empty() && match_prefix(r.hf, hf, index, rest)) return HfSource{fill(r.ours, index) + rest, hf};
    for (const auto& part : r.parts)
      if (match_prefix(r.hf + "." + part, hf, index, rest)) return HfSource{fill(r.ours, index) + rest, hf};
  }
  return std::nullopt;
}

std::optional<HfSource> HfNameMap::from_hf(const std::string& hf) const {
  const std::string name = canonical(hf);
  if (ignored(name)) return std::nullopt;
  return match(name);
}

bool HfNameMap::ignored(const std::string& hf) const {
  for (const auto& g : ignored_)
    if (glob(g, hf)) return true;
  return false;
}

}  // namespace colossal::nn
