// SequenceAttention: how attention is computed when the sequence is split across ranks (sequence
// parallelism). Everything else in a block works token by token, so only attention needs the other
// ranks' tokens; the factory hands Attention one of these (parallel/sequence_attention.h: gathered keys
// and values, ring attention, or DeepSpeed-Ulysses's all-to-all) and a model never knows.
#pragma once
#include <ATen/core/Tensor.h>

namespace colossal::nn {

class SequenceAttention {
 public:
  virtual ~SequenceAttention() = default;
  // q, k, v: this rank's tokens [B, H, T_local, D] (in the layout's order) -> its queries' outputs
  // [B, H, T_local, D], attending to every rank's keys (the earlier ones only when causal). `alibi`:
  // the heads' ALiBi slopes [H] (BLOOM), biasing each score by slope x (key - query position).
  // `keys`: which keys of the whole sequence are real [B, T] (bool, in position order; an encoder's
  // padding), or undefined: all of them.
  virtual at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal, const at::Tensor& alibi = {},
                            const at::Tensor& keys = {}) = 0;
  // x: this rank's tokens of the stream [B, T_local, ...] with dropout p: the whole sequence's mask drawn
  // (nn::dropout_noise) and this rank's tokens of it kept.
  virtual at::Tensor dropout(const at::Tensor& x, double p) = 0;
  // For a model that builds each sequence whole on every rank (ViT from its patches): the number of
  // equal chunks a sequence is cut into (pad it to a multiple), and x [B, T, ...] -> this rank's tokens.
  virtual int64_t chunks() const = 0;
  virtual at::Tensor local_tokens(const at::Tensor& x) = 0;
  // x: this rank's tokens [B, T_local, C] -> the sequence's first token [B, C] on every rank (a
  // classifier's class token), from the rank holding it. Its gradient reaches that rank times the ranks,
  // so that averaging gradients over the sequence's ranks leaves one copy of the classifier loss's.
  virtual at::Tensor first_token(const at::Tensor& x) = 0;
};

}  // namespace colossal::nn
