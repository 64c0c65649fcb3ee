// BLOOM model: see bloom.h.
#include "models/bloom/bloom.h"

#include <ATen/ATen.h>

namespace colossal::bloom {
namespace {

nn::HfNameMap name_map(int64_t heads) {
  return nn::HfNameMap(
      {
          {"wte", "transformer.word_embeddings"},
          {"ln_emb", "transformer.word_embeddings_layernorm"},
          {"blocks.*.ln_1", "transformer.h.*.input_layernorm"},
          {"blocks.*.attn.qkv", "transformer.h.*.self_attention.query_key_value", false, {}, heads},
          {"blocks.*.attn.proj", "transformer.h.*.self_attention.dense"},
          {"blocks.*.ln_2", "transformer.h.*.post_attention_layernorm"},
          {"blocks.*.mlp.fc", "transformer.h.*.mlp.dense_h_to_4h"},
          {"blocks.*.mlp.proj", "transformer.h.*.mlp.dense_4h_to_h"},
          {"ln_f", "transformer.ln_f"},
      },
      {"lm_head.weight"}, "transformer.");   // bigscience/bloom-* are saved from BloomModel, without the prefix
}

}  // namespace

Bloom::Bloom(const BloomConfig& c, nn::LayerFactory& f) : cfg_(c), names_(name_map(c.n_head)) {
  const int64_t e = c.n_embd;
  wte = register_module("wte", f.embedding(c.vocab_size, e, nn::Split::Vocab));
  ln_emb = register_module("ln_emb", f.layer_norm(e, c.layer_norm_eps));
  const nn::BlockSpec spec{
      .attn = {.width = e, .heads = c.n_head, .causal = true, .bias = true, .dropout = c.dropout, .attn_dropout = c.attn_dropout,
               .alibi = true},
      .mlp = {.width = e, .hidden = 4 * e, .act = nn::Act::GeluTanh, .bias = true, .dropout = c.dropout},
      .norm_eps = c.layer_norm_eps,
      .pre_norm = true};
  blocks_ = nn::add_blocks(*this, spec, c.n_layer, f);
  ln_f = register_module("ln_f", f.layer_norm(e, c.layer_norm_eps));
}

void Bloom::init_parameter(const std::string& name, const at::Tensor& value) const { nn::init_normal(name, value, cfg_.init_std); }

at::Tensor Bloom::features(const at::Tensor& ids, const nn::ForwardOptions& o) {
  (void)nn::positions_of(ids, o, cfg_.max_positions);   // refuses a sequence past the context; ALiBi needs no ids
  auto embed = [&] { return ln_emb->forward(wte->forward(ids)); };   // [B, T, C]
  return ln_f->forward(nn::run_blocks(blocks_, embed, o, block_hooks()));
}

nn::KvCache Bloom::make_cache(int64_t batch, int64_t capacity, const c10::Device& device) const {
  const auto opts = cache_options(device, wte->output_dtype());
  return nn::make_kv_cache(cfg_.n_layer, batch, blocks_.front()->heads(), capacity, cfg_.n_embd / cfg_.n_head, opts);
}

}  // namespace colossal::bloom
