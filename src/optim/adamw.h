// AdamW (decoupled weight decay, Loshchilov & Hutter) over parameter pieces. On CPU each piece is one
// call of the fused kernel in kernels/cpu; on CUDA every fp32 piece goes to kernels/cuda's multi-piece
// kernel (ATen's fused AdamW where that was not built); elsewhere the same update as tensor ops.
#pragma once
#include "src/optim/optimizer.h"

namespace colossal::optim {

struct AdamWOptions {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
};

class AdamW : public Optimizer {
 public:
  explicit AdamW(const AdamWOptions& options) : opt_(options) {}
  std::string name() const override { return "adamw"; }
  std::vector<std::string> state_names() const override { return {"exp_avg", "exp_avg_sq"}; }
  void update(std::vector<ParamPiece>& pieces, const StepContext& ctx) override;
  bool elementwise() const override { return true; }
  bool folds_grad_scale() const override { return true; }
  bool reads_half_grads() const override { return true; }

 private:
  void update_on_gpu(const std::vector<ParamPiece*>& pieces, const StepContext& ctx);
  AdamWOptions opt_;
  at::Tensor device_step_;   // parameters on a GPU: the step count ATen's fused kernel reads
};

}  // namespace colossal::optim
