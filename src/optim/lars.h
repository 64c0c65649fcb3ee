// LARS (You, Gitman & Ginsburg, "Large Batch Training of Convolutional Networks", 2017, Algorithm 1):
// momentum SGD whose step each tensor scales by a local learning rate from its own norms. Per step:
//   local = eta * ||w|| / (||g|| + wd ||w|| + eps)      (1 when ||w|| or ||g|| is 0)
//   v = mu v + lr * local * (g + wd w)                 w -= v
// Tensors without weight decay (biases, norms) take plain momentum SGD (local = 1), as the usual LARS
// recipes exclude them. Under ZeRO a tensor split across shards gets its norms summed across them.
#pragma once
#include "src/optim/optimizer.h"

namespace colossal::optim {

struct LarsOptions {
  double momentum = 0.9;
  double trust_coefficient = 0.001;   // eta
  double eps = 1e-9;
};

class Lars : public Optimizer {
 public:
  explicit Lars(const LarsOptions& options) : opt_(options) {}
  std::string name() const override { return "lars"; }
  std::vector<std::string> state_names() const override { return {"momentum_buffer"}; }
  void update(std::vector<ParamPiece>& pieces, const StepContext& ctx) override;
  bool elementwise() const override { return false; }

 private:
  LarsOptions opt_;
};

}  // namespace colossal::optim
