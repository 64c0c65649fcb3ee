// Which blocks activation checkpointing recomputes under a memory target (`activation_checkpoint =
// "auto"`): the fewest seconds of recomputation whose activations fit, found by dynamic programming over
// the block sequence (in the spirit of Colossal-AI's search over a linearised graph and Chen et al.'s
// checkpoint selection), from each block's measured cost.
//
// For one micro-batch, a kept block holds `kept` bytes from its forward to its backward (its output
// among them); a recomputed block holds only its output, and in backward its rerun holds `kept` again
// while the blocks before it still hold theirs. So the peak is the larger of the sum over the blocks
// after forward and, for each recomputed block i, the blocks before i's sum plus i's `kept`.
#pragma once
#include <cstdint>
#include <vector>

namespace colossal::memory {

struct BlockActivation {
  double kept = 0;      // bytes a kept block's forward leaves until its backward (its output included)
  double output = 0;    // bytes of its output (what a recomputed block leaves)
  double forward_s = 0; // its forward's time: what recomputing it costs
};

struct RecomputePlan {
  std::vector<bool> recompute;   // per block
  double peak = 0;               // the blocks' activation peak the plan predicts (bytes)
  double seconds = 0;            // recomputation a micro-batch pays
  double kept_whole = 0;         // the peak with no block recomputed (what the plan saves is kept_whole - peak)
  int64_t count() const;
};

// The blocks' activation peak if `recompute` says which are recomputed.
double activation_peak(const std::vector<BlockActivation>& blocks, const std::vector<bool>& recompute);
// The cheapest plan whose peak is at most `budget` bytes; nullopt-like: recompute empty when none fits
// (even recomputing every block: see smallest_budget).
RecomputePlan plan_recompute(const std::vector<BlockActivation>& blocks, double budget);
// The least budget any plan fits in (the smallest peak over all plans).
double smallest_budget(const std::vector<BlockActivation>& blocks);

}  // namespace colossal::memory
