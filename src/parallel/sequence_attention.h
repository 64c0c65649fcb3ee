// Attention over a sequence split across the sequence-parallel group, three ways (nn::SequenceAttention):
//  - split_gather: every rank all-gathers the keys and values of the whole sequence and attends its own
//    queries to them (the gradients of keys and values are reduce-scattered back). Memory for one
//    sequence's keys and values per layer; two collectives a layer each way.
//  - ring: keys and values travel around the ring of ranks, one chunk a step, each step's exchange
//    overlapping its block of attention (Colossal-AI's ring self-attention, with the online softmax of
//    blockwise attention); causal blocks that see nothing are skipped and the zigzag layout gives every
//    rank the same work. Memory for two chunks' keys and values, whatever the sequence.
//  - all_to_all: DeepSpeed-Ulysses. An all-to-all trades the sequence split for a head split, each rank
//    attends whole sequences on its heads, and a second one trades back. Needs heads divisible by the
//    group; four all-to-alls a layer each way, each 1/S of the activations.
#pragma once
#include <memory>
#include <optional>
#include <string>

#include "src/nn/sequence_attention.h"
#include "src/parallel/sequence_layout.h"

namespace colossal::dist {
class Group;
}

namespace colossal::parallel {

enum class SequenceMode { split_gather, ring, all_to_all };
SequenceMode parse_sequence_mode(const std::string& name);   // "split_gather" | "ring" | "all_to_all"

// The layout each mode cuts the sequence in (ring: zigzag), for this rank of `group`.
SequenceLayout sequence_layout(SequenceMode mode, const dist::Group& group);
// The mode's attention over `group` (which must outlive it).
std::shared_ptr<nn::SequenceAttention> make_sequence_attention(SequenceMode mode, dist::Group& group);

// Ring attention alone (ring_attention.cpp): q [B, H, Tq, D] of this rank's chunks, k and v of its own,
// -> [B, H, Tq, D]; `alibi`: the heads' slopes, or undefined; `keys`: the whole sequence's real keys
// [B, T] (bool, position order), or undefined.
at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal, const SequenceLayout& layout,
                          dist::Group& group, const at::Tensor& alibi = {}, const at::Tensor& keys = {});

// The scores' mask of queries at `qpos` [Tq] against keys at `kpos` [Tk] for the modes that attend with
// ATen: ALiBi's float bias (with the causal future at -inf), a bool causal mask, and the real keys of
// `keys` [B, T] (at kpos); nullopt when nothing is masked. [B or 1, H or 1, Tq, Tk].
std::optional<at::Tensor> scores_mask(const at::Tensor& qpos, const at::Tensor& kpos, bool causal, const at::Tensor& alibi,
                                      const at::Tensor& keys);

}  // namespace colossal::parallel
