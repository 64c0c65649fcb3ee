// Residual transformer block: see block.h.
#include "src/nn/block.h"

namespace colossal::nn {

// Registration order (norms first) fixes the parameter order, hence the initial draws and the flat
// optimizer layout that checkpoints made before this block existed were written in.
TransformerBlock::TransformerBlock(const BlockSpec& s, LayerFactory& f) : pre_norm_(s.pre_norm) {
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

}  // namespace colossal::nn
