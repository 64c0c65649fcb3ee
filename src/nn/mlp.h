// Position-wise MLP: column-split expansion, activation, row-split projection, dropout.
#pragma once
#include <ATen/core/Tensor.h>
#include <memory>

#include "src/nn/factory.h"
#include "src/nn/kernel_choice.h"
#include "src/nn/module.h"

namespace colossal::nn {

class Mlp : public Module {
 public:
  Mlp(const MlpSpec& spec, LayerFactory& factory);
  at::Tensor forward(const at::Tensor& x);   // [B, T, C] -> [B, T, C]

  // What a fused decoding step (TransformerBlock, kernels/cpu/decode_block.h) takes from this MLP for
  // `rows` new tokens: where forward would run both products on the decoding kernels and the activation
  // is GELU (tanh, our kernel chosen) or ReLU, at inference. False elsewhere.
  struct DecodeParts {
    kernels::DecodeProduct fc, proj;
    kernels::DecodeActivation act;
  };
  bool decode_parts(int64_t rows, DecodeParts& parts);

 private:
  MlpSpec spec_;
  std::shared_ptr<const StreamCut> cut_;   // dropout on the layout's piece of the stream
  std::shared_ptr<Linear> fc_, proj_;
  ChoiceMemo gelu_choice_;   // decode_parts' lookup of the GELU policy, keyed by the activation's size
};

}  // namespace colossal::nn
