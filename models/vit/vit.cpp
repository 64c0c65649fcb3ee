// ViT model: see vit.h.
#include "models/vit/vit.h"

#include <ATen/ATen.h>

#include "src/nn/causal_lm.h"

namespace colossal::vit {

Vit::Vit(const VitConfig& c, nn::LayerFactory& f) : cfg_(c), cut_(f.stream_cut()) {
  const int64_t e = c.n_embd, features = e / cut_->pieces();   // this rank's features of the stream
  patch = register_module("patch", std::make_shared<nn::PatchEmbedding>(c.channels, e, c.patch_size, f));
  cls_token = register_parameter("cls_token", f.parameter({1, 1, features}), true, cut_->shard(2));
  position_embeddings = register_parameter("position_embeddings", f.parameter({1, c.patches() + 1, features}), true, cut_->shard(2));
  const nn::BlockSpec spec{
      .attn = {.width = e, .heads = c.n_head, .causal = false, .bias = true, .dropout = c.dropout, .attn_dropout = c.attn_dropout},
      .mlp = {.width = e, .hidden = c.intermediate, .act = activation_of(c), .bias = true, .dropout = c.dropout},
      .norm_eps = c.layer_norm_eps,
      .pre_norm = true};
  blocks_ = nn::add_blocks(*this, spec, c.n_layer, f);
  ln_f = register_module("ln_f", f.layer_norm(e, c.layer_norm_eps));
  classifier = register_module("classifier", f.linear({.in = e, .out = c.num_labels, .split = nn::Split::Head}));
}

void Vit::init_parameter(const std::string& name, const at::Tensor& value) const { nn::init_normal(name, value, cfg_.init_std); }

at::Tensor Vit::features(const at::Tensor& images) {
  TORCH_CHECK(images.dim() == 4 && images.size(1) == cfg_.channels && images.size(2) == cfg_.image_size &&
                  images.size(3) == cfg_.image_size,
              "ViT expects images [B, ", cfg_.channels, ", ", cfg_.image_size, ", ", cfg_.image_size, "], got ", images.sizes());
  const double p = is_training() ? cfg_.dropout : 0.0;
  const int64_t chunks = cut_->token_chunks();
  // [B, N + 1, C]: the patches' projections after the class token, with their positions
  auto tokens = [&] {
    auto x = patch->forward(images);                                                  // [B, N, C]
    return at::cat({cut_->use(cls_token).expand({x.size(0), 1, x.size(2)}), x}, 1) + cut_->use(position_embeddings);
  };
  if (chunks == 1) {
    auto embed = [&] {
      auto x = tokens();
      return p > 0 ? cut_->dropout(x, p) : x;
    };
    return ln_f->forward(nn::run_blocks(blocks_, embed, {}, block_hooks()));
  }
  // A sequence split across ranks: every rank builds the whole sequence (its dropout drawn whole, as one
  // process draws it); padded to whole chunks, whose padding no query attends to; this rank's tokens.
  const int64_t t = cfg_.patches() + 1, padded = (t + chunks - 1) / chunks * chunks;
  nn::ForwardOptions o;
  if (padded > t) o.mask = at::arange(padded, at::TensorOptions(at::kLong).device(images.device())).lt(t).view({1, 1, 1, padded});
  auto embed = [&] {
    auto x = tokens();
    if (p > 0) x = at::dropout(x, p, true);
    if (padded > t) x = at::constant_pad_nd(x, {0, 0, 0, padded - t});
    return cut_->local_tokens(x);
  };
  return ln_f->forward(nn::run_blocks(blocks_, embed, o, block_hooks()));
}

at::Tensor Vit::classify_images(const at::Tensor& images) { return classifier->forward(cut_->first_token(features(images))); }

const nn::HfNameMap& Vit::hf_names() const {
  static const nn::HfNameMap map(
      {
          {"patch", "vit.embeddings.patch_embeddings.projection"},
          {"cls_token", "vit.embeddings.cls_token"},
          {"position_embeddings", "vit.embeddings.position_embeddings"},
          {"blocks.*.ln_1", "vit.encoder.layer.*.layernorm_before"},
          {"blocks.*.attn.qkv", "vit.encoder.layer.*.attention.attention", false, {"query", "key", "value"}},
          {"blocks.*.attn.proj", "vit.encoder.layer.*.attention.output.dense"},
          {"blocks.*.ln_2", "vit.encoder.layer.*.layernorm_after"},
          {"blocks.*.mlp.fc", "vit.encoder.layer.*.intermediate.dense"},
          {"blocks.*.mlp.proj", "vit.encoder.layer.*.output.dense"},
          {"ln_f", "vit.layernorm"},
          {"classifier", "classifier"},
      },
      {"vit.pooler.dense.weight", "vit.pooler.dense.bias"}, "vit.");   // ViTModel checkpoints carry a pooler
  return map;
}

}  // namespace colossal::vit
