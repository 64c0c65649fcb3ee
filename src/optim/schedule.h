// Learning-rate schedule: linear warmup, then cosine (or linear) decay to min_lr, then constant.
#pragma once
#include <cstdint>

#include "src/core/recipe.h"

namespace colossal::optim {

double lr_at(const OptimConfig& c, int64_t step);   // step is 0-based (the step about to run)

}  // namespace colossal::optim
