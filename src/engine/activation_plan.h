// Which blocks activation checkpointing recomputes: none, every block, every n-th, or, for "auto", the
// cheapest choice whose activations fit [memory] activation_memory_gb (src/memory/recompute_plan.h),
// from each block's cost measured on one training micro-batch (its kept bytes and forward time, read
// while every block runs recomputed, so measuring never holds more than the outputs), or, for the dry
// run, estimated from the shape.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "src/core/recipe.h"
#include "src/memory/recompute_plan.h"

namespace colossal {

struct TrainPlan;

// "none", "full" and "every_n" as a mask over `blocks` blocks (empty for none; "auto" is measured).
std::vector<bool> fixed_recompute_mask(const MemoryConfig& memory, int64_t blocks);
// Each block's cost on one micro-batch of the plan's task, measured through the model's own forward.
std::vector<memory::BlockActivation> measure_block_activations(TrainPlan& plan);
// The same from the recipe's shape alone (the dry run): about 17 values of [B, T, C] kept a block.
std::vector<memory::BlockActivation> estimate_block_activations(const Recipe& recipe);
// The plan for activation_memory_gb over `blocks`; a RecipeError at the key when no plan fits, naming the
// smallest budget that would. `how`: "measured" or "estimated", for the message.
memory::RecomputePlan choose_recompute(const Recipe& recipe, const std::vector<memory::BlockActivation>& blocks, const std::string& how);
// "recomputing 3 of 12 blocks (0, 4, 8): 1.2 GiB of a 1.5 GiB target, 45 ms of reruns a micro-batch".
std::string describe_recompute(const Recipe& recipe, const memory::RecomputePlan& plan);

}  // namespace colossal
