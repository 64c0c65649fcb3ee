// Residual transformer block: see block.h.
#include "src/nn/block.h"

#include <ATen/core/grad_mode.h>

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
  if (pre_norm_) {
    auto h = x + attn->forward(ln_1->forward(x), kv, offset, mask);   // [B, T, C]
    return h + mlp->forward(ln_2->forward(h));
  }
  auto h = ln_1->forward(x + attn->forward(x, kv, offset, mask));
  return ln_2->forward(h + mlp->forward(h));
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
