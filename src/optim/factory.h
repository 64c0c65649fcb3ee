// The recipe's [optim] name and hyper-parameters as an update rule.
#pragma once
#include <memory>

#include "src/core/recipe.h"
#include "src/optim/optimizer.h"

namespace colossal::optim {

std::unique_ptr<Optimizer> make_optimizer(const OptimConfig& config);

}  // namespace colossal::optim
