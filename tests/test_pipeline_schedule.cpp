// Pipeline schedules and partitions as data: every rank's passes run against the others in the
// simulator without deadlock, each micro-batch through every stage both ways, with the idle fraction
// theory gives and the activations each schedule is known to hold.
#include <gtest/gtest.h>

#include "src/core/error.h"
#include "src/parallel/pipeline_partition.h"
#include "src/parallel/pipeline_schedule.h"

using namespace colossal;
using namespace colossal::parallel;

namespace {

std::vector<std::vector<PipelinePass>> every_rank(PipelineSchedule s, int64_t p, int64_t m, int64_t v) {
  std::vector<std::vector<PipelinePass>> out;
  for (int64_t r = 0; r < p; ++r) out.push_back(pipeline_passes(s, p, r, m, v));
  return out;
}

}  // namespace

TEST(PipelineSchedule, EveryScheduleRunsEveryMicroBatchBothWaysWithTheBubbleTheoryGives) {
  for (int64_t p : {2, 3, 4})
    for (int64_t m : {1, 2, 4, 8, 12}) {
      for (auto s : {PipelineSchedule::gpipe, PipelineSchedule::one_f_one_b}) {
        const auto run = simulate_schedule(every_rank(s, p, m, 1), 1, m);
        for (int64_t r = 0; r < p; ++r) {
          EXPECT_NEAR(run.idle[static_cast<size_t>(r)], theoretical_bubble(s, p, m, 1), 1e-12) << schedule_name(s) << " p" << p << " m" << m;
          // 1F1B holds at most P - r micro-batches' activations; GPipe every one of them.
          const int64_t held = run.peak_held[static_cast<size_t>(r)];
          if (s == PipelineSchedule::one_f_one_b) EXPECT_EQ(held, std::min(m, p - r)) << "p" << p << " m" << m << " r" << r;
          else EXPECT_EQ(held, m);
        }
      }
      // Zero-bubble: W passes fill what 1F1B leaves idle, with 1F1B's bound on micro-batches held.
      const auto zb = simulate_schedule(every_rank(PipelineSchedule::zero_bubble, p, m, 1), 1, m, 1, 1, 1);
      for (int64_t r = 0; r < p; ++r) {
        if (m >= p)   // the bound needs a full pipe: with fewer micro-batches each runs through alone
          EXPECT_LE(zb.idle[static_cast<size_t>(r)], theoretical_bubble(PipelineSchedule::zero_bubble, p, m, 1) * 1.2 + 1e-12) << "p" << p << " m" << m;
        EXPECT_LE(zb.peak_held[static_cast<size_t>(r)], p + 1);
      }
      if (m % p != 0) continue;
      for (int64_t v : {2, 3}) {
        const auto run = simulate_schedule(every_rank(PipelineSchedule::interleaved, p, m, v), v, m);
        for (int64_t r = 0; r < p; ++r) {
          // The fill shrinks by v: (P - 1) / (v M + P - 1) when M > P; with M = P every forward comes first.
          const double theory = theoretical_bubble(PipelineSchedule::interleaved, p, m, v);
          EXPECT_LE(run.idle[static_cast<size_t>(r)], theory * 1.2 + 1e-12) << "p" << p << " m" << m << " v" << v;
          EXPECT_LT(run.idle[static_cast<size_t>(r)], theoretical_bubble(PipelineSchedule::one_f_one_b, p, m, 1));
        }
      }
    }
}

TEST(PipelineSchedule, TheSimulatorCatchesOrdersThatDeadlockOrSkipAPass) {
  // Both ranks wait for a backward first: rank 0's needs rank 1's, which needs its own forward, which
  // needs rank 0's forward.
  std::vector<std::vector<PipelinePass>> stuck{{{PipelinePass::backward, 0, 0}, {PipelinePass::forward, 0, 0}},
                                               {{PipelinePass::forward, 0, 0}, {PipelinePass::backward, 0, 0}}};
  EXPECT_THROW(simulate_schedule(stuck, 1, 1), Error);
  std::vector<std::vector<PipelinePass>> missing{{{PipelinePass::forward, 0, 0}}, {{PipelinePass::forward, 0, 0}, {PipelinePass::backward, 0, 0}}};
  EXPECT_THROW(simulate_schedule(missing, 1, 1), Error);
  EXPECT_THROW(pipeline_passes(PipelineSchedule::interleaved, 4, 0, 6, 2), Error);   // groups of P micro-batches
  EXPECT_THROW(parse_pipeline_schedule("pipedream"), Error);
}

TEST(PipelinePartition, UniformAndBalancedCutsAreContiguousAndBalanced) {
  EXPECT_EQ(uniform_partition(8, 4), (std::vector<int64_t>{0, 2, 4, 6, 8}));
  EXPECT_EQ(uniform_partition(6, 4), (std::vector<int64_t>{0, 2, 4, 5, 6}));
  EXPECT_THROW(uniform_partition(3, 4), Error);
  // Equal blocks and a head worth two of them: the last stage takes two blocks fewer.
  EXPECT_EQ(balanced_partition(std::vector<double>(8, 1.0), 0, 2, 2), (std::vector<int64_t>{0, 5, 8}));
  // An embedding of three blocks' worth on the first stage of three.
  EXPECT_EQ(balanced_partition(std::vector<double>(9, 1.0), 3, 0, 3), (std::vector<int64_t>{0, 1, 5, 9}));
  // Uneven blocks: the costliest stage is as cheap as a contiguous cut allows (5 + 1 | 2 + 2 + 2).
  EXPECT_EQ(balanced_partition({5, 1, 2, 2, 2}, 0, 0, 2), (std::vector<int64_t>{0, 2, 5}));
}
