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

HfNameMap::HfNameMap(std::vector<HfNameRule> rules, std::vector<std::string> ignored_on_import)
    : rules_(std::move(rules)), ignored_(std::move(ignored_on_import)) {}

HfName HfNameMap::to_hf(const std::string& ours) const {
  std::string index, rest;
  for (const auto& r : rules_)
    if (match_prefix(r.ours, ours, index, rest))
      return {fill(r.hf, index) + rest, r.transpose && rest == ".weight"};
  throw Error("no Hugging Face name for parameter \"" + ours + "\"");
}

std::optional<HfName> HfNameMap::from_hf(const std::string& hf) const {
  if (ignored(hf)) return std::nullopt;
  std::string index, rest;
  for (const auto& r : rules_)
    if (match_prefix(r.hf, hf, index, rest)) return HfName{fill(r.ours, index) + rest, r.transpose && rest == ".weight"};
  return std::nullopt;
}

bool HfNameMap::ignored(const std::string& hf) const {
  for (const auto& g : ignored_)
    if (glob(g, hf)) return true;
  return false;
}

}  // namespace colossal::nn
