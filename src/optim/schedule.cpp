// Learning-rate schedule: see schedule.h.
#include "src/optim/schedule.h"

#include <algorithm>
#include <cmath>

namespace colossal::optim {

double lr_at(const OptimConfig& c, int64_t step) {
  if (step < c.warmup_steps) return c.lr * static_cast<double>(step + 1) / static_cast<double>(c.warmup_steps);
  if (c.schedule == "constant") return c.lr;
  const double span = static_cast<double>(std::max<int64_t>(1, c.decay_steps - c.warmup_steps));
  const double progress = std::clamp(static_cast<double>(step - c.warmup_steps) / span, 0.0, 1.0);
  if (c.schedule == "linear") return c.lr - (c.lr - c.min_lr) * progress;
  return c.min_lr + 0.5 * (1.0 + std::cos(M_PI * progress)) * (c.lr - c.min_lr);
}

}  // namespace colossal::optim
