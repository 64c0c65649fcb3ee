// Pipeline schedules as data: the ordered passes each pipeline rank runs in one training step, and a
// simulator that runs every rank's list against the others to measure what a schedule costs.
//
// P ranks each hold v chunks of the model's blocks; chunk c of rank r is virtual stage c * P + r, so a
// micro-batch visits the ranks v times round (Megatron's interleaving; v = 1 otherwise). Of M
// micro-batches a step:
//  - gpipe:       every forward, then every backward (holds all M micro-batches' activations);
//  - 1f1b:        P - r - 1 forwards to fill the pipe, then one forward and one backward in turn, then
//                 the remaining backwards (PipeDream-Flush: at most P - r micro-batches held);
//  - interleaved: 1F1B over the v chunks, in groups of P micro-batches (needs M a multiple of P); the
//                 fill and drain shrink by v;
//  - zero_bubble: backward split into its input-gradient pass (B, what the stage before waits for) and
//                 its weight-gradient pass (W, which nobody waits for), as in Qi et al.'s zero-bubble
//                 pipeline: the W passes fill the time 1F1B leaves idle. The order is found by running
//                 every rank's choices against the others with passes of equal time: a rank takes a ready
//                 B first, then a forward while under 1F1B's bound of micro-batches waiting for their B
//                 (and at most P + 1 waiting for their W, whose activations live until it), then a W.
// Theory, with a backward twice a forward's time: the idle fraction of gpipe and 1f1b is
// (P - 1) / (M + P - 1), of interleaved (P - 1) / (v M + P - 1); zero_bubble's, with F = B = W,
// (P - 1) / (3 M + P - 1) at most, a third of 1F1B's.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace colossal::parallel {

enum class PipelineSchedule { gpipe, one_f_one_b, interleaved, zero_bubble };
PipelineSchedule parse_pipeline_schedule(const std::string& name);   // the recipe's word; Error otherwise
const char* schedule_name(PipelineSchedule s);

struct PipelinePass {
  enum Kind : uint8_t { forward, backward, weight };   // backward: the whole of it, or zero_bubble's input part
  Kind kind = forward;
  int64_t micro = 0;   // micro-batch
  int64_t chunk = 0;   // which of the rank's chunks of blocks (0 without interleaving)
  bool operator==(const PipelinePass&) const = default;
};

// The passes rank `rank` of `ranks` runs in one step of `micros` micro-batches over `chunks` chunks a rank.
std::vector<PipelinePass> pipeline_passes(PipelineSchedule s, int64_t ranks, int64_t rank, int64_t micros, int64_t chunks);

// (P - 1) / (v M + P - 1): the idle fraction of a rank with forwards of 1 and backwards of 2;
// zero_bubble's bound (P - 1) / (3 M + P - 1) with its three passes of 1.
double theoretical_bubble(PipelineSchedule s, int64_t ranks, int64_t micros, int64_t chunks);
// The time units a pass costs in schedule s (forward 1; backward 2, or 1 and 1 split into B and W).
double pass_cost(PipelineSchedule s, PipelinePass::Kind kind);

// Every rank's passes run against each other with forwards of `forward` time units, backwards of
// `backward` and weight passes of `weight`: a forward waits for the stage before (the same micro-batch's
// forward), a backward for the stage after (its backward) and its own forward, a weight pass for its
// own backward. Sends never block. Error if the lists deadlock or leave a pass unmatched. A micro-batch is
// held from its forward to its backward, or to its weight pass where there is one.
struct ScheduleRun {
  double makespan = 0;
  std::vector<double> idle;               // per rank: the fraction of the makespan it waited
  std::vector<int64_t> peak_held;         // per rank: the most micro-batch chunks whose activations it held at once
};
ScheduleRun simulate_schedule(const std::vector<std::vector<PipelinePass>>& passes, int64_t chunks, int64_t micros,
                              double forward = 1, double backward = 2, double weight = 1);

}  // namespace colossal::parallel
