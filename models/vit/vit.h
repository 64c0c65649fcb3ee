// ViT: patch embedding (a Conv2d with stride = kernel = patch), a learned class token prepended and
// learned position embeddings added, pre-LN blocks of bidirectional attention and an exact-GELU MLP,
// a final LayerNorm, and a linear classifier on the class token (ViTForImageClassification).
// Built from src/nn blocks; HF keeps query, key and value as three tensors, which the name map joins.
#pragma once
#include <memory>
#include <vector>

#include "models/vit/vit_config.h"
#include "src/nn/block.h"
#include "src/nn/encoder.h"
#include "src/nn/factory.h"
#include "src/nn/layer_norm.h"
#include "src/nn/patch_embedding.h"

namespace colossal::vit {

class Vit : public nn::ImageClassifier {
 public:
  Vit(const VitConfig& c, nn::LayerFactory& f);

  at::Tensor features(const at::Tensor& images);   // [B, ch, H, W] -> [B, patches + 1, C] after the final norm
  at::Tensor classify_images(const at::Tensor& images) override;
  int64_t num_labels() const override { return cfg_.num_labels; }
  int64_t image_size() const override { return cfg_.image_size; }
  int64_t channels() const override { return cfg_.channels; }
  std::vector<std::string> embedding_modules() const override { return {"patch", "cls_token", "position_embeddings"}; }
  void init_parameter(const std::string& name, const at::Tensor& value) const override;
  const nn::HfNameMap& hf_names() const override;
  nlohmann::json hf_config() const override { return to_hf_config(cfg_); }

 private:
  VitConfig cfg_;
  std::shared_ptr<nn::PatchEmbedding> patch;
  std::shared_ptr<const nn::StreamCut> cut_;   // how the layout holds the stream's features
  at::Tensor cls_token, position_embeddings;   // [1, 1, C], [1, patches + 1, C] (C / pieces when cut)
  std::shared_ptr<nn::LayerNorm> ln_f;
  std::shared_ptr<nn::Linear> classifier;
};

}  // namespace colossal::vit
