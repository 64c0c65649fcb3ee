// StepPlan: one step of the serving engine as the model sees it (each scheduled token's id, position and
// block table, and which rows' logits are taken), and how a tensor-parallel server runs it on every rank.
// Rank 0 schedules (requests, blocks, sampling) and sends each step's plan to the other ranks before its
// own forward; they run the same forward on their pieces of the model over their own pools of KV blocks,
// which hold the same block ids (every rank sizes its pool alike). An idle pass of rank 0's engine sends
// an empty plan, so the others wait between requests without their collectives timing out; stopping
// sends a last one that ends them.
#pragma once
#include <ATen/core/Tensor.h>
#include <cstdint>
#include <optional>
#include <vector>

#include "src/nn/causal_lm.h"
#include "src/serve/kv_blocks.h"

namespace colossal::dist {
class Group;
}

namespace colossal::serve {

struct StepPlan {
  std::vector<int64_t> ids, positions, table_of;   // one a row; table_of: the row's sequence's table
  std::vector<std::vector<int32_t>> tables;        // each scheduled sequence's block table, once
  std::vector<int64_t> logit_rows;                 // the rows whose next-token logits are taken
};

// The plan's forward over `blocks` (on their device): the logits [M, V] of its logit rows, as host fp32
// for sampling (undefined when none).
at::Tensor forward_plan(nn::CausalLM& model, const KvBlocks& blocks, const StepPlan& plan);

// Rank 0's end of the exchange (group rank 0 sends, the others receive).
class StepMirror {
 public:
  explicit StepMirror(dist::Group& group) : group_(group) {}
  void send(const StepPlan& plan);   // a step
  void idle();                       // nothing to run now
  void stop();                       // the last message
  // The others' end: the next step's plan, or none when rank 0 stopped (idle passes are skipped).
  std::optional<StepPlan> receive();

 private:
  void send_kind(int64_t kind, const at::Tensor& payload);
  dist::Group& group_;
};

// A rank other than 0 of a tensor-parallel server: runs every plan rank 0 sends until it stops.
void follow_steps(nn::CausalLM& model, KvBlocks& blocks, StepMirror& mirror);

}  // namespace colossal::serve
