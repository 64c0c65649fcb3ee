// Residual transformer block: see block.h.
#include "src/nn/block.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <cmath>

#include "src/nn/cached_attention.h"
#include "src/nn/kernel_choice.h"
#include "src/nn/linear_forward.h"

namespace colossal::nn {

// Registration order (norms first) fixes the parameter order, hence the initial draws and the flat
// optimizer layout that checkpoints made before this block existed were written in.
TransformerBlock::TransformerBlock(const BlockSpec& s, LayerFactory& f) : pre_norm_(s.pre_norm), cut_(f.stream_cut()) {
  ln_1 = register_module("ln_1", f.layer_norm(s.attn.width, s.norm_eps));
  ln_2 = register_module("ln_2", f.layer_norm(s.mlp.width, s.norm_eps));
  attn = register_module("attn", f.attention(s.attn));
  mlp = register_module("mlp", f.mlp(s.mlp));
}

at::Tensor TransformerBlock::forward(const at::Tensor& x, LayerKv* kv, int64_t offset, const at::Tensor& mask) {
  if (kv)
    if (auto y = fused_decode(x, *kv, offset, mask); y.defined()) return y;
  if (pre_norm_) {
    auto h = x + attn->forward(ln_1->forward(x), kv, offset, mask);   // [B, T, C]
    return h + mlp->forward(ln_2->forward(h));
  }
  auto h = ln_1->forward(x + attn->forward(x, kv, offset, mask));
  return ln_2->forward(h + mlp->forward(h));
}

at::Tensor TransformerBlock::fused_decode(const at::Tensor& x, LayerKv& kv, int64_t offset, const at::Tensor& mask) {
  if (!pre_norm_ || !fused_choice_.get(0, [] { return std::optional<bool>(kernel_policy().fused_decode_block); }) ||
      at::GradMode::is_enabled() || !x.is_cpu() ||
      x.scalar_type() != at::kFloat || x.dim() != 3 || x.size(1) != 1 || x.size(0) < 1 || x.size(0) > kGemvMaxRows)
    return {};
  const int64_t rows = x.size(0), width = x.size(2);
  kernels::DecodeBlockStep s;
  Attention::DecodeParts a;
  Mlp::DecodeParts m;
  if (!ln_1->kernel_params(rows, s.ln1_gamma, s.ln1_beta, s.ln1_eps) || !ln_2->kernel_params(rows, s.ln2_gamma, s.ln2_beta, s.ln2_eps) ||
      !attn->decode_parts(rows, kv, offset, mask, a) || !mlp->decode_parts(rows, m) || a.qkv.in != width || m.fc.in != width)
    return {};
  const at::Tensor xc = x.contiguous();
  at::Tensor y = at::empty_like(xc);
  s.rows = rows;
  s.width = width;
  s.hidden = m.fc.out;
  s.heads = attn->heads();
  s.head_dim = attn->head_dim();
  s.x = xc.const_data_ptr<float>();
  s.out = y.mutable_data_ptr<float>();
  s.qkv = a.qkv;
  s.proj = a.proj;
  s.fc = m.fc;
  s.fc2 = m.proj;
  s.act = m.act;
  s.k_cache = kv.k.mutable_data_ptr();
  s.v_cache = kv.v.mutable_data_ptr();
  s.kv_element = *kv_element_of(kv.k);   // decode_parts took only caches the kernels store
  if (kv.paged) {
    s.positions = kv.paged->positions.data();
    s.tables = kv.paged->tables.data();
    s.block_size = kv.paged->block_size;
  } else {
    s.capacity = kv.k.size(2);
    s.length = offset + 1;
    s.valid = mask.defined() ? reinterpret_cast<const uint8_t*>(mask.const_data_ptr<bool>()) : nullptr;
    s.valid_stride = offset + 1;
  }
  s.alibi_slopes = a.alibi_slopes;
  s.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.head_dim)));   // cached_attention.cpp's
  kernels::decode_block_step(s);
  return y;
}

std::vector<std::shared_ptr<TransformerBlock>> add_blocks(Module& owner, const BlockSpec& spec, int64_t n, LayerFactory& f) {
  auto list = owner.register_module("blocks", std::make_shared<ModuleList>());
  std::vector<std::shared_ptr<TransformerBlock>> blocks;
  struct InBlocks {   // the factory builds block layers until this returns, or throws
    LayerFactory& f;
    explicit InBlocks(LayerFactory& factory) : f(factory) { f.set_in_blocks(true); }
    ~InBlocks() { f.set_in_blocks(false); }
  } in_blocks(f);
  for (int64_t i = 0; i < n; ++i) {
    blocks.push_back(std::make_shared<TransformerBlock>(spec, f));
    list->push_back(blocks.back());
  }
  return blocks;
}

void init_normal(const std::string& name, const at::Tensor& value, double std) {
  const bool is_norm = name.find("ln_") != std::string::npos;
  const bool is_bias = name.size() > 5 && name.substr(name.size() - 5) == ".bias";
  if (is_norm && !is_bias) value.fill_(1.0);
  else if (is_bias) value.zero_();
  else value.normal_(0.0, std);
}

}  // namespace colossal::nn
