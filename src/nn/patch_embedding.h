// PatchEmbedding: ViT's image tokenizer, a Conv2d whose kernel and stride are the patch size, so
// each non-overlapping p x p patch becomes one C-wide token. Parameters "weight" [C, channels, p, p]
// and "bias" [C], as torch's Conv2d names them (checkpoints map onto HF's projection unchanged). Under
// a layout that cuts the stream's features (2D, 3D) a rank holds the filters of its features only.
#pragma once
#include <ATen/core/Tensor.h>
#include <memory>

#include "src/nn/factory.h"
#include "src/nn/module.h"

namespace colossal::nn {

class PatchEmbedding : public Module {
 public:
  PatchEmbedding(int64_t channels, int64_t width, int64_t patch, const LayerFactory& f);
  at::Tensor forward(const at::Tensor& images);   // [B, channels, H, W] -> [B, (H/p)(W/p), C / pieces]

  at::Tensor weight, bias;

 private:
  int64_t patch_;
  std::shared_ptr<const StreamCut> cut_;
};

}  // namespace colossal::nn
