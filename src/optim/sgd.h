// SGD with momentum, as torch.optim.SGD computes it (dampening 0): coupled L2 weight decay, a momentum
// buffer that starts at the first gradient, optionally Nesterov's look-ahead. Per step:
//   d = g + wd w       b = mu b + d       w -= lr * (nesterov ? d + mu b : b)
#pragma once
#include "src/optim/optimizer.h"

namespace colossal::optim {

struct SgdOptions {
  double momentum = 0.9;
  bool nesterov = false;
};

class Sgd : public Optimizer {
 public:
  explicit Sgd(const SgdOptions& options) : opt_(options) {}
  std::string name() const override { return "sgd"; }
  // Without momentum there is no buffer to keep (torch keeps none either): no memory, nothing saved.
  std::vector<std::string> state_names() const override {
    return opt_.momentum == 0 ? std::vector<std::string>{} : std::vector<std::string>{"momentum_buffer"};
  }
  void update(std::vector<ParamPiece>& pieces, const StepContext& ctx) override;
  bool elementwise() const override { return true; }

 private:
  SgdOptions opt_;
};

}  // namespace colossal::optim
