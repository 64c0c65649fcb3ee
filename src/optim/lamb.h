// LAMB (You et al., "Large Batch Optimization for Deep Learning: Training BERT in 76 minutes", 2020,
// Algorithm 2): Adam's direction with decoupled weight decay, scaled per tensor by the trust ratio
// ||w|| / ||r||, which lets the batch grow to 64k (Colossal-AI's route from 512 to 64k). Per step, for
// each tensor:
//   m = b1 m + (1 - b1) g        v = b2 v + (1 - b2) g^2
//   r = (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) + wd w
//   w -= lr * phi * r            phi = ||w|| / ||r|| (1 when either is 0)
// As in BERT's LAMB, tensors without weight decay (biases, norms) are also excluded from the layer-wise
// adaptation (phi = 1). Under ZeRO a tensor split across shards gets its norms summed across them.
#pragma once
#include "src/optim/optimizer.h"

namespace colossal::optim {

struct LambOptions {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-6;
};

class Lamb : public Optimizer {
 public:
  explicit Lamb(const LambOptions& options) : opt_(options) {}
  std::string name() const override { return "lamb"; }
  std::vector<std::string> state_names() const override { return {"exp_avg", "exp_avg_sq"}; }
  void update(std::vector<ParamPiece>& pieces, const StepContext& ctx) override;
  bool elementwise() const override { return false; }

 private:
  LambOptions opt_;
};

}  // namespace colossal::optim
