// Lion (Chen et al., "Symbolic Discovery of Optimization Algorithms", 2023, Program 1): the sign of an
// interpolated momentum, with decoupled weight decay; one state tensor instead of Adam's two. Per step:
//   c = b1 m + (1 - b1) g       w -= lr * (sign(c) + wd w)       m = b2 m + (1 - b2) g
#pragma once
#include "src/optim/optimizer.h"

namespace colossal::optim {

struct LionOptions {
  double beta1 = 0.9, beta2 = 0.99;
};

class Lion : public Optimizer {
 public:
  explicit Lion(const LionOptions& options) : opt_(options) {}
  std::string name() const override { return "lion"; }
  std::vector<std::string> state_names() const override { return {"exp_avg"}; }
  void update(std::vector<ParamPiece>& pieces, const StepContext& ctx) override;
  bool elementwise() const override { return true; }

 private:
  LionOptions opt_;
};

}  // namespace colossal::optim
