// The recipe's [optim] name and hyper-parameters as an update rule.
#pragma once
#include <memory>

#include "src/core/recipe.h"
#include "src/optim/optimizer.h"

namespace colossal::optim {

std::unique_ptr<Optimizer> make_optimizer(const OptimConfig& config);
// Values of optimizer state each parameter carries (2 for AdamW's moments, 1 for SGD's momentum, ...).
int64_t states_per_parameter(const OptimConfig& config);

}  // namespace colossal::optim
