// Patch embedding: see patch_embedding.h.
#include "src/nn/patch_embedding.h"

#include <ATen/ATen.h>

namespace colossal::nn {

PatchEmbedding::PatchEmbedding(int64_t channels, int64_t width, int64_t patch, const LayerFactory& f)
    : patch_(patch), cut_(f.stream_cut()) {
  const int64_t filters = width / cut_->pieces();   // the layout has checked that it divides
  weight = register_parameter("weight", f.parameter({filters, channels, patch, patch}), true, cut_->shard(0));
  bias = register_parameter("bias", f.parameter({filters}), true, cut_->shard(0));
}

at::Tensor PatchEmbedding::forward(const at::Tensor& images) {
  // Images arrive as fp32; a model computing in bf16 or fp16 takes them in its own type.
  auto x = at::conv2d(images.to(weight.scalar_type()), cut_->use(weight), cut_->use(bias), {patch_, patch_});   // [B, C, H/p, W/p]
  return x.flatten(2).transpose(1, 2);                           // [B, N, C]
}

}  // namespace colossal::nn
