// The vocabulary split across a tensor-parallel group: each rank's lookups of its range, and the tied
// LM head with its cross entropy.
//
// The tied LM head and its cross entropy when the vocabulary is split across a tensor-parallel group
// (Megatron's vocabulary-parallel cross entropy): each rank computes the logits of its own range of
// the vocabulary, and the softmax's max, its normaliser and each target's logit are combined by two
// all-reduces of N values, so the full [N, V] logits never exist on any rank.
#pragma once
#include <ATen/core/Tensor.h>

namespace colossal::dist {
class Group;
}

namespace colossal::parallel {

// `ids` [...] looked up in `weight` [V/P, C], this rank's rows [first, first + V/P) of the table, and
// zeros for the ids outside it: [..., C], a partial sum over the ranges of the group (gradients flow to
// weight).
at::Tensor vocab_range_lookup(const at::Tensor& weight, const at::Tensor& ids, int64_t first);

// x [N, C] (the same on every rank, inside the region: its gradient is this rank's part), weight [V/P, C]
// holding vocabulary rows [first, first + V/P), targets [N] (negative: ignored) -> the mean loss over
// the targets not ignored, equal on every rank. Gradients flow to x and weight.
at::Tensor vocab_parallel_cross_entropy(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& targets, int64_t first,
                                        dist::Group& group);

}  // namespace colossal::parallel
