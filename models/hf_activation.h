// Activation names as Hugging Face configs write them ("gelu", "gelu_new", "relu", ...) and as
// recipes do ([model] activation: gelu, gelu_tanh, relu), for the families that let configs choose.
#pragma once
#include <string>
#include <vector>

#include "src/nn/factory.h"

namespace colossal {

// The HF names a family reads (for HfConfigReader::choice).
const std::vector<std::string>& hf_activation_names();
// A recipe's name ("auto" keeps `family_default`, an HF name) -> the HF name.
std::string hf_activation_of_recipe(const std::string& ours, const std::string& family_default);
// An HF name -> the recipe's name.
std::string recipe_activation_of_hf(const std::string& hf);
// An HF name -> the activation the blocks compute; Error naming `family` for an unknown one.
nn::Act activation_of_hf(const std::string& hf, const std::string& family);

}  // namespace colossal
