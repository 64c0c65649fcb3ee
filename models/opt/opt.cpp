// OPT model: see opt.h.
#include "models/opt/opt.h"

#include <ATen/ATen.h>

namespace colossal::opt {

Opt::Opt(const OptConfig& c, nn::LayerFactory& f) : cfg_(c) {
  const int64_t e = c.n_embd;
  embed_tokens = register_module("embed_tokens", f.embedding(c.vocab_size, c.embed_dim, nn::Split::Vocab));
  embed_positions = register_module("embed_positions", f.embedding(c.max_positions + kPositionOffset, e));
  if (c.embed_dim != e) {
    project_in = register_module("project_in", f.linear({.in = c.embed_dim, .out = e, .bias = false}));
    project_out = register_module("project_out", f.linear({.in = e, .out = c.embed_dim, .bias = false}));
  }
  const nn::BlockSpec spec{
      .attn = {.width = e, .heads = c.n_head, .causal = true, .bias = c.bias, .dropout = c.dropout, .attn_dropout = c.attn_dropout},
      .mlp = {.width = e, .hidden = c.ffn_dim, .act = activation_of(c), .bias = c.bias, .dropout = c.dropout},
      .norm_eps = 1e-5,
      .pre_norm = c.pre_norm};
  blocks_ = nn::add_blocks(*this, spec, c.n_layer, f);
  if (c.pre_norm) ln_f = register_module("ln_f", f.layer_norm(e, 1e-5));
}

void Opt::init_parameter(const std::string& name, const at::Tensor& value) const { nn::init_normal(name, value, cfg_.init_std); }

at::Tensor Opt::embed(const at::Tensor& ids, const at::Tensor& positions) {
  auto x = embed_tokens->forward(ids);             // [B, T, embed_dim]
  if (project_in) x = project_in->forward(x);      // [B, T, C]
  return x + embed_positions->forward(positions + kPositionOffset);
}

at::Tensor Opt::features(const at::Tensor& ids, const nn::ForwardOptions& o) {
  const at::Tensor positions = nn::positions_of(ids, o, cfg_.max_positions);
  auto x = nn::run_blocks(blocks_, [&] { return embed(ids, positions); }, o, block_hooks());   // [B, T, C]
  if (ln_f) x = ln_f->forward(x);
  return project_out ? project_out->forward(x) : x;   // [B, T, embed_dim]
}

nn::KvCache Opt::make_cache(int64_t batch, int64_t capacity, const c10::Device& device) const {
  const auto opts = cache_options(device, embed_tokens->output_dtype());
  return nn::make_kv_cache(cfg_.n_layer, batch, blocks_.front()->heads(), capacity, cfg_.n_embd / cfg_.n_head, opts);
}

const nn::HfNameMap& Opt::hf_names() const {
  static const nn::HfNameMap map(
      {
          {"embed_tokens", "model.decoder.embed_tokens"},
          {"embed_positions", "model.decoder.embed_positions"},
          {"project_in", "model.decoder.project_in"},
          {"project_out", "model.decoder.project_out"},
          {"blocks.*.ln_1", "model.decoder.layers.*.self_attn_layer_norm"},
          {"blocks.*.ln_2", "model.decoder.layers.*.final_layer_norm"},
          {"blocks.*.attn.qkv", "model.decoder.layers.*.self_attn", false, {"q_proj", "k_proj", "v_proj"}},
          {"blocks.*.attn.proj", "model.decoder.layers.*.self_attn.out_proj"},
          {"blocks.*.mlp.fc", "model.decoder.layers.*.fc1"},
          {"blocks.*.mlp.proj", "model.decoder.layers.*.fc2"},
          {"ln_f", "model.decoder.final_layer_norm"},
      },
      {"lm_head.weight"}, "model.");
  return map;
}

}  // namespace colossal::opt
