// AdamW over flat buffers (decoupled weight decay, Loshchilov & Hutter). On CPU each group is one
// call of the fused kernel in kernels/cpu; on CUDA ATen's fused multi-tensor kernel; elsewhere the same update as tensor ops.
#pragma once
#include <ATen/core/Tensor.h>
#include <array>
#include <cstdint>
#include <vector>

#include "src/optim/flat_params.h"

namespace colossal::optim {

struct AdamWOptions {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
};

class AdamW {
 public:
  AdamW(FlatParams& params, const AdamWOptions& options);
  void step(double lr);   // uses the gradients in the flat buffers

  int64_t steps() const { return step_; }
  void set_steps(int64_t s) { step_ = s; }
  // Moments, one pair per group, aligned with FlatParams::groups().
  std::vector<at::Tensor>& exp_avg() { return exp_avg_; }
  std::vector<at::Tensor>& exp_avg_sq() { return exp_avg_sq_; }

 private:
  FlatParams& params_;
  AdamWOptions opt_;
  int64_t step_ = 0;
  std::vector<at::Tensor> exp_avg_, exp_avg_sq_;
  std::vector<at::Tensor> device_steps_;   // per group when the parameters are on a GPU: the step count ATen's fused kernel reads
};

}  // namespace colossal::optim
