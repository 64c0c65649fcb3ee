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
//  - zero_bubble: not scheduled here yet (the engine refuses it).
// Theory, with a backward twice a forward's time: the idle fraction of gpipe and 1f1b is
// (P - 1) / (M + P - 1), of interleaved (P - 1) / (v M + P - 1).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace colossal::parallel {

enum class PipelineSchedule { gpipe, one_f_one_b, interleaved, zero_bubble };
PipelineSchedule parse_pipeline_schedule(const std::string& name);   // the recipe's word; Error otherwise
const char* schedule_name(PipelineSchedule s);

struct PipelinePass {
  enum Kind : uint8_t { forward, backward };
  Kind kind = forward;
  int64_t micro = 0;   // micro-batch
  int64_t chunk = 0;   // which of the rank's chunks of blocks (0 without interleaving)
  bool operator==(const PipelinePass&) const = default;
};

// The passes rank `rank` of `ranks` runs in one step of `micros` micro-batches over `chunks` chunks a rank.
std::vector<PipelinePass> pipeline_passes(PipelineSchedule s, int64_t ranks, int64_t rank, int64_t micros, int64_t chunks);

// (P - 1) / (v M + P - 1): the idle fraction of a rank with forwards of 1 and backwards of 2.
double theoretical_bubble(PipelineSchedule s, int64_t ranks, int64_t micros, int64_t chunks);

// Every rank's passes run against each other with forwards of `forward` time units and backwards of
// `backward`: a forward waits for the stage before (the same micro-batch's forward), a backward for the
// stage after (its backward) and its own forward. Sends never block. Error if the lists deadlock or
// leave a pass unmatched.
struct ScheduleRun {
  double makespan = 0;
  std::vector<double> idle;               // per rank: the fraction of the makespan it waited
  std::vector<int64_t> peak_held;         // per rank: the most micro-batch chunks whose activations it held at once
};
ScheduleRun simulate_schedule(const std::vector<std::vector<PipelinePass>>& passes, int64_t chunks, int64_t micros,
                              double forward = 1, double backward = 2);

}  // namespace colossal::parallel
