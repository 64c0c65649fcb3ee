// LayerNorm over the last axis with parameters `weight` and `bias` (torch's names, so checkpoints map
// as before). On CPU float tensors it runs kernels/cpu/layer_norm as one autograd function (one pass
// each way, parameter gradients included) when that wins at the shape (kernel_choice.h, kernel
// "layer_norm"); elsewhere ATen's at::layer_norm.
#pragma once
#include <ATen/core/Tensor.h>

#include "src/nn/factory.h"
#include "src/nn/kernel_choice.h"
#include "src/nn/module.h"

namespace colossal::nn {

class LayerNorm : public Module {
 public:
  LayerNorm(int64_t dim, double eps, const LayerFactory& f);   // parameters from f (values: the model's init rules)
  virtual at::Tensor forward(const at::Tensor& x);   // [..., dim] -> [..., dim]
  // The parameters as the CPU kernel takes them, for the fused decoding block (kernels/cpu/decode_block.h)
  // over `rows` CPU float rows in no gradient mode, unless the policy forces ATen's LayerNorm
  // (kernel_choice.h); false elsewhere, and for a split layout's LayerNorm (a subclass).
  bool kernel_params(int64_t rows, const float*& gamma, const float*& beta, float& eps) const;

  at::Tensor weight, bias;

 protected:
  // A tensor-parallel LayerNorm's: `local` of the features here, each parameter a piece as `shard` says.
  LayerNorm(int64_t local, double eps, const LayerFactory& f, const ShardSpec& shard);
  // x normalised with scale `w` and shift `b` (the parameters as a split layout uses them), on the
  // kernel the shape chose.
  at::Tensor normalise(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b);
  int64_t dim_;
  double eps_;
  mutable ChoiceMemo kernel_choice_;   // kernel_params' lookup of the policy, keyed by the rows
};

// The two paths alone (for tests and timing): ours needs a CPU float input.
at::Tensor fused_layer_norm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, double eps);
at::Tensor aten_layer_norm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, double eps);

}  // namespace colossal::nn
