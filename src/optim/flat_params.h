// FlatParams: a model's parameters moved into one contiguous buffer per optimizer group (decayed
// matrices/embeddings, undecayed biases/norms), with each parameter a view into it and each
// gradient pre-assigned as a view into a matching flat gradient buffer. Autograd then accumulates
// straight into the flat buffer, and optimizers, clipping and (later) collectives see a few large
// tensors instead of hundreds of small ones.
#pragma once
#include <ATen/core/Tensor.h>
#include <string>
#include <vector>

#include "src/nn/module.h"

namespace colossal::optim {

struct FlatSegment {
  std::string name;        // the parameter's name in the module
  int64_t offset = 0, numel = 0;
  std::vector<int64_t> shape;
};

struct FlatGroup {
  at::Tensor params, grads;   // 1-D, same length
  double weight_decay = 0.0;
  std::vector<FlatSegment> segments;
};

class FlatParams {
 public:
  FlatParams(nn::Module& module, double weight_decay);

  std::vector<FlatGroup>& groups() { return groups_; }
  const std::vector<FlatGroup>& groups() const { return groups_; }
  void zero_grad();
  // Scales gradients so their global L2 norm is at most max_norm (if > 0); returns the norm before.
  double clip_grad_norm(double max_norm);
  int64_t numel() const;

 private:
  std::vector<FlatGroup> groups_;
};

}  // namespace colossal::optim
