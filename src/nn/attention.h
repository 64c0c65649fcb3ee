// Multi-head self-attention with a fused QKV projection (column-split) and an output projection
// (row-split): under tensor parallelism a rank computes its range of heads whole, between the two
// splits (Megatron's attention), so nothing here communicates. On ATen's scaled_dot_product_attention (flash/memory-efficient kernels where the
// device has them). Optionally reads and extends a per-layer KV cache for generation.
#pragma once
#include <ATen/core/Tensor.h>
#include <memory>
#include <vector>

#include "src/nn/factory.h"
#include "src/nn/kernel_choice.h"
#include "src/nn/module.h"

namespace colossal::nn {

// Serving's step over several sequences at once (kernels/cpu/paged_attention.h): row i of the input
// [N, 1, C] is one token at positions[i] of the sequence whose block table is tables[i]; keys and values
// live in the layer's pool of blocks of block_size positions.
struct PagedGather;   // paged_attention_aten.cpp's indices for the step
struct PagedRows {
  int64_t block_size = 16;
  std::vector<int64_t> positions;
  std::vector<const int32_t*> tables;
  // ATen's path (paged_attention_aten.h): the step's indices on the device, built by its first layer in
  // one transfer and read by the others.
  mutable std::shared_ptr<const PagedGather> gather;
};

// Keys and values of one layer for positions [0, length) of each sequence: [B, H, capacity, head_dim];
// or, with `paged`, the layer's block pool [num_blocks, H, block_size, head_dim] that the rows index.
struct LayerKv {
  at::Tensor k, v;
  const PagedRows* paged = nullptr;
  // A captured decoding step's write position (engine/decode_graphs.h): int64 [1] on the cache's device.
  // Where defined, a one-token step writes its key and value there, not at the host's offset, and attends
  // over [0, offset + 1) under its mask, so the step's shapes stay those of the captured graph while the
  // position moves.
  at::Tensor slot;
};

class Attention : public Module {
 public:
  Attention(const AttentionSpec& spec, LayerFactory& factory);

  // x [B, T, C] -> [B, T, C]. With `kv`, keys/values of the T new positions are written at
  // [offset, offset+T) and attention runs over [0, offset+T). `mask` (bool, true = may attend),
  // broadcastable to [B, H, T, offset+T], replaces the causal rule when given.
  at::Tensor forward(const at::Tensor& x, LayerKv* kv = nullptr, int64_t offset = 0, const at::Tensor& mask = {});

  int64_t heads() const { return heads_.count; }   // computed here (all, unless tensor-parallel)
  int64_t head_dim() const { return spec_.width / spec_.heads; }

  // What a fused decoding step (TransformerBlock, kernels/cpu/decode_block.h) takes from this layer for
  // `rows` new tokens against kv at `offset`: where forward would run the QKV and output products on the
  // decoding kernels and the CPU attention kernel (the decoding one already chosen at these shapes, or the
  // paged one of serving; either with ALiBi's slopes), with no split sequence or heads and a mask that
  // kernel takes. False elsewhere.
  struct DecodeParts {
    kernels::DecodeProduct qkv, proj;
    const float* alibi_slopes = nullptr;
  };
  bool decode_parts(int64_t rows, const LayerKv& kv, int64_t offset, const at::Tensor& mask, DecodeParts& parts);

 private:
  // Serving's rows against their sequences' blocks (kv.paged): packed [N, 1, 3C] -> [N, 1, C], on the
  // CPU kernel for CPU float, on ATen elsewhere (paged_attention_aten.h).
  at::Tensor paged_forward(const at::Tensor& packed, LayerKv& kv);
  // Attention whose probabilities drop with a mask from region_random_ (a bool `mask`: true may attend;
  // a float one: added to the scores): the tensor-parallel path with attention dropout.
  at::Tensor attention_dropping(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask, bool causal,
                                double p);
  // ALiBi's path: ATen's attention with the distance bias as its float mask, with or without a cache.
  at::Tensor alibi_forward(const at::Tensor& packed, LayerKv* kv, int64_t offset, const at::Tensor& mask, double p_attn);
  const at::Tensor& slopes_like(const at::Tensor& packed);   // device_slopes_ on packed's device and dtype

  AttentionSpec spec_;
  HeadRange heads_;   // of spec_.heads, the ones this rank computes (the factory's split)
  std::shared_ptr<RandomStream> region_random_;   // the probabilities' dropout draws here when the heads are split
  std::shared_ptr<SequenceAttention> sequence_;    // the sequence is split across ranks (training and eval)
  std::function<at::Tensor(const at::Tensor&)> mask_rows_;   // the factory's attention_rows
  std::shared_ptr<const StreamCut> cut_;   // dropout on the layout's piece of the stream
  std::shared_ptr<Linear> qkv_, proj_;
  at::Tensor alibi_slopes_;   // [local heads] on the CPU, when spec_.alibi
  at::Tensor device_slopes_;  // alibi_slopes_ where the activations are, kept: no host copy inside a captured step
  ChoiceMemo decode_choice_;  // decode_parts' lookup of the attention policy, keyed by the rows
};

}  // namespace colossal::nn
