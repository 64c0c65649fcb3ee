// Whether a model can be split N ways by 1D tensor parallelism, checked from its config before anything
// is allocated (training's [parallel] tensor, infer's and serve's --tensor-parallel).
#pragma once
#include <cstdint>
#include <string>

#include "src/core/recipe.h"

namespace colossal {

// The dimensions a 1D split divides: heads, the MLP's hidden width and (language families) the
// vocabulary. Error "<where> = N does not divide the model's n_head = 12 (tensor sizes that divide
// every split dimension: 1, 2, 3, 4, 6, 12)" when one does not.
void check_tensor_split(const ModelConfig& model, int64_t tensor, const std::string& where);

}  // namespace colossal
