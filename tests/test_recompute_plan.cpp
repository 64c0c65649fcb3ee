// The automatic choice of recomputed blocks: within its budget, as cheap as the best of every subset
// (exhaustive on small random block sequences), fewer blocks as the budget grows, and the smallest budget
// any choice fits.
#include <gtest/gtest.h>

#include <random>

#include "src/memory/recompute_plan.h"

using namespace colossal::memory;

TEST(RecomputePlan, IsTheCheapestChoiceWithinTheBudgetOnRandomBlocks) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> kept(5, 40), out(1, 4), time(0.5, 3);
  for (int trial = 0; trial < 200; ++trial) {
    const size_t n = 1 + rng() % 9;
    std::vector<BlockActivation> blocks;
    for (size_t i = 0; i < n; ++i) blocks.push_back({kept(rng), out(rng), time(rng)});
    const double none = activation_peak(blocks, std::vector<bool>(n, false));
    const double budget = std::uniform_real_distribution<double>(0.2, 1.1)(rng) * none;
    // Every subset: the cheapest that fits. The planner rounds costs up to 1/4096 of the budget, so it may
    // miss a subset that fits by less than that; it never returns one that does not fit.
    double best = -1;
    for (uint32_t mask = 0; mask < (1u << n); ++mask) {
      std::vector<bool> r(n);
      double t = 0;
      for (size_t i = 0; i < n; ++i) r[i] = mask >> i & 1, t += r[i] ? blocks[i].forward_s : 0;
      if (activation_peak(blocks, r) <= budget * (1 - n / 4096.0) && (best < 0 || t < best)) best = t;
    }
    const RecomputePlan plan = plan_recompute(blocks, budget);
    if (plan.recompute.empty()) {
      EXPECT_LT(best, 0) << "trial " << trial << ": a subset fits but the planner found none";
      EXPECT_GT(smallest_budget(blocks), budget * (1 - n / 4096.0));
      continue;
    }
    EXPECT_LE(plan.peak, budget * (1 + 1e-12)) << "trial " << trial;
    EXPECT_NEAR(plan.peak, activation_peak(blocks, plan.recompute), 1e-9);
    if (best >= 0) EXPECT_LE(plan.seconds, best + 1e-9) << "trial " << trial;
  }
}

TEST(RecomputePlan, RecomputesFewerBlocksAsTheBudgetGrowsAndNamesTheSmallestThatFits) {
  // Twelve equal blocks, each keeping 17 of its output's size (GPT's block at fused attention).
  const std::vector<BlockActivation> blocks(12, {17.0, 1.0, 1.0});
  const double none = activation_peak(blocks, std::vector<bool>(12, false));   // 204
  EXPECT_EQ(none, 204);
  int64_t last = 13;
  for (double budget = 30; budget <= 210; budget += 10) {
    const RecomputePlan plan = plan_recompute(blocks, budget);
    ASSERT_FALSE(plan.recompute.empty()) << budget;
    EXPECT_LE(plan.peak, budget);
    EXPECT_LE(plan.count(), last) << budget;
    last = plan.count();
  }
  EXPECT_EQ(plan_recompute(blocks, 210).count(), 0);
  // Near the least: every block recomputed but the last, whose kept activations at the end of forward
  // cost what its rerun would (11 outputs and its 17 = 28), so rerunning it buys nothing.
  EXPECT_EQ(plan_recompute(blocks, 32).count(), 11);
  EXPECT_FALSE(plan_recompute(blocks, 32).recompute.back());
  // Every block recomputed: the last rerun holds 11 outputs and its own 17 = 28; nothing fits in less.
  EXPECT_NEAR(smallest_budget(blocks), 28, 0.1);
  EXPECT_TRUE(plan_recompute(blocks, 27).recompute.empty());
}
