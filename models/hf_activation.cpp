// HF activation names: see hf_activation.h.
#include "models/hf_activation.h"

#include "src/core/error.h"

namespace colossal {
namespace {

struct ActName {
  const char* hf;
  const char* ours;
  nn::Act act;
};
// gelu is the exact (erf) GELU; gelu_new and gelu_pytorch_tanh are both the tanh approximation.
constexpr ActName kActs[] = {{"relu", "relu", nn::Act::Relu},
                             {"gelu", "gelu", nn::Act::Gelu},
                             {"gelu_new", "gelu_tanh", nn::Act::GeluTanh},
                             {"gelu_pytorch_tanh", "gelu_tanh", nn::Act::GeluTanh}};

}  // namespace

const std::vector<std::string>& hf_activation_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const auto& a : kActs) v.emplace_back(a.hf);
    return v;
  }();
  return names;
}

std::string hf_activation_of_recipe(const std::string& ours, const std::string& family_default) {
  for (const auto& a : kActs)
    if (ours == a.ours) return a.hf;
  return family_default;
}

std::string recipe_activation_of_hf(const std::string& hf) {
  for (const auto& a : kActs)
    if (hf == a.hf) return a.ours;
  return "auto";
}

nn::Act activation_of_hf(const std::string& hf, const std::string& family) {
  for (const auto& a : kActs)
    if (hf == a.hf) return a.act;
  throw Error(family + ": unknown activation \"" + hf + "\"");
}

}  // namespace colossal
