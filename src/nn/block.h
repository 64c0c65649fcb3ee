// TransformerBlock: the residual block every family here is made of: self-attention and an MLP, each
// with a LayerNorm, placed before the sublayer (pre-LN: GPT-2, OPT, BLOOM, ViT) or after the residual
// add (post-LN: BERT, OPT-350m). Children are ln_1, attn, ln_2, mlp; families map those names onto
// their HF names, so no family carries its own copy of the block.
#pragma once
#include <ATen/core/Tensor.h>
#include <memory>
#include <vector>

#include "src/nn/attention.h"
#include "src/nn/factory.h"
#include "src/nn/kernel_choice.h"
#include "src/nn/layer_norm.h"
#include "src/nn/mlp.h"
#include "src/nn/module.h"

namespace colossal::nn {

struct BlockSpec {
  AttentionSpec attn;
  MlpSpec mlp;
  double norm_eps = 1e-5;
  bool pre_norm = true;
};

class TransformerBlock : public Module {
 public:
  TransformerBlock(const BlockSpec& spec, LayerFactory& f);
  // x [B, T, C] -> [B, T, C]; kv, offset and mask as Attention::forward takes them.
  at::Tensor forward(const at::Tensor& x, LayerKv* kv = nullptr, int64_t offset = 0, const at::Tensor& mask = {});
  // The attention heads this block computes (a tensor-parallel rank's share), as its KV cache holds them.
  int64_t heads() const { return attn->heads(); }
  // How the layout holds the stream inside the blocks (run_blocks enters and leaves it).
  const StreamCut& stream() const { return *cut_; }

 private:
  // A pre-norm block's one-token step on CPU in one parallel region (kernels/cpu/decode_block.h), where
  // each of its parts would run our decoding kernels op by op; undefined elsewhere (forward then goes
  // op by op). The same bits either way.
  at::Tensor fused_decode(const at::Tensor& x, LayerKv& kv, int64_t offset, const at::Tensor& mask);

  bool pre_norm_;
  ChoiceMemo fused_choice_;   // KernelPolicy::fused_decode_block, looked up once per policy
  std::shared_ptr<const StreamCut> cut_;
  std::shared_ptr<LayerNorm> ln_1, ln_2;
  std::shared_ptr<Attention> attn;
  std::shared_ptr<Mlp> mlp;
};

// `n` blocks of `spec`, registered in `owner` as the module list "blocks" (parameters "blocks.i.*")
// and returned in order, as run_blocks takes them.
std::vector<std::shared_ptr<TransformerBlock>> add_blocks(Module& owner, const BlockSpec& spec, int64_t n, LayerFactory& f);

// OPT's, BLOOM's, BERT's and ViT's initialisation rule for parameter `name`, as transformers does it:
// N(0, std) for every matrix and embedding, zero biases, unit LayerNorm scales (parameters under a
// module named "ln_*"). Fills `value` (Model::init_parameter's contract).
void init_normal(const std::string& name, const at::Tensor& value, double std);

}  // namespace colossal::nn
