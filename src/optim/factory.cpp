// Optimizer from the recipe: see factory.h.
#include "src/optim/factory.h"

#include "src/core/error.h"
#include "src/optim/adamw.h"
#include "src/optim/lamb.h"
#include "src/optim/lars.h"
#include "src/optim/lion.h"
#include "src/optim/sgd.h"

namespace colossal::optim {

std::unique_ptr<Optimizer> make_optimizer(const OptimConfig& c) {
  if (c.name == "adamw") return std::make_unique<AdamW>(AdamWOptions{c.betas[0], c.betas[1], c.eps});
  if (c.name == "lamb") return std::make_unique<Lamb>(LambOptions{c.betas[0], c.betas[1], c.eps});
  if (c.name == "lars") return std::make_unique<Lars>(LarsOptions{c.momentum, c.trust_coefficient, c.eps});
  if (c.name == "lion") return std::make_unique<Lion>(LionOptions{c.betas[0], c.betas[1]});
  if (c.name == "sgd") return std::make_unique<Sgd>(SgdOptions{c.momentum, c.nesterov});
  throw Error("optimizer \"" + c.name + "\" is not one of adamw, lamb, lars, lion, sgd (internal: the recipe checks the name)");
}

int64_t states_per_parameter(const OptimConfig& config) {
  return static_cast<int64_t>(make_optimizer(config)->state_names().size());
}

}  // namespace colossal::optim
