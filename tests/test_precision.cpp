// Mixed precision through the trainer: bf16 and fp16 follow the fp32 loss curve (fp32 master weights
// and optimizer states in the chunks), fp16's dynamic loss scale skips an overflowed step and backs
// off, grows after clean steps, and survives a resume.
#include <gtest/gtest.h>

#include <cmath>

#include "src/engine/trainer.h"
#include "tests/support/test_support.h"

using namespace colossal;
using colossal::test::TempDir;

namespace {

Recipe recipe(const std::string& out, int64_t steps, std::vector<std::string> extra) {
  extra.insert(extra.begin(), {"train.device=cpu", "model.dropout=0", "train.eval_every=0", "checkpoint.every=0", "optim.decay_steps=50",
                               "kernels.attention=fused", "kernels.gelu=fused", "kernels.gemv=fused", "kernels.layer_norm=fused",
                               "kernels.gemm=fused"});
  return colossal::test::tiny_training_recipe(out, steps, extra);
}

std::vector<double> losses(const TempDir& d) { return colossal::test::metric_values(d / "metrics.jsonl", "loss"); }

}  // namespace

TEST(Precision, Bf16AndFp16FollowTheFp32LossCurveOverFiftySteps) {
  TempDir f32, b16, f16;
  ASSERT_EQ(run_training(recipe(f32.path(), 50, {}), {.quiet = true}), 0);
  ASSERT_EQ(run_training(recipe(b16.path(), 50, {"precision.dtype=bf16"}), {.quiet = true}), 0);
  ASSERT_EQ(run_training(recipe(f16.path(), 50, {"precision.dtype=fp16"}), {.quiet = true}), 0);
  const auto ref = losses(f32), bf = losses(b16), hf = losses(f16);
  ASSERT_EQ(bf.size(), 50u);
  ASSERT_EQ(hf.size(), 50u);
  EXPECT_LT(ref.back(), ref.front() - 0.3);   // it learns
  // The stated tolerance: every step within 2% of fp32's loss for bf16 (8 bits of mantissa in every
  // product), 1% for fp16 (11 bits); the last ten steps' mean within 0.5%.
  double tail_ref = 0, tail_bf = 0, tail_hf = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_NEAR(bf[i], ref[i], 0.02 * ref[i]) << "bf16, step " << i + 1;
    EXPECT_NEAR(hf[i], ref[i], 0.01 * ref[i]) << "fp16, step " << i + 1;
    if (i >= 40) {
      tail_ref += ref[i];
      tail_bf += bf[i];
      tail_hf += hf[i];
    }
  }
  EXPECT_NEAR(tail_bf, tail_ref, 0.005 * tail_ref);
  EXPECT_NEAR(tail_hf, tail_ref, 0.005 * tail_ref);
}

TEST(Precision, AnFp16OverflowIsSkippedTheScaleBacksOffAndGrowsAgain) {
  TempDir d;
  // 2^24 overflows fp16's gradients (largest value 65504) at once; the scale halves on each overflow
  // and doubles after every 4 clean steps, so overflows come back as it grows.
  ASSERT_EQ(run_training(recipe(d.path(), 24, {"precision.dtype=fp16", "precision.initial_scale=16777216",
                                               "precision.growth_interval=4"}),
                         {.quiet = true}),
            0);
  const auto scale = colossal::test::metric_values(d / "metrics.jsonl", "loss_scale");
  const auto skipped = colossal::test::metric_values(d / "metrics.jsonl", "skipped_steps");
  const auto norm = colossal::test::metric_values(d / "metrics.jsonl", "grad_norm");   // null (inf) is left out
  ASSERT_EQ(scale.size(), 24u);
  EXPECT_EQ(scale[0], 16777216.0);
  EXPECT_GE(skipped[0], 1);
  int backoffs = 0, growths = 0;
  for (size_t i = 1; i < scale.size(); ++i) {
    if (skipped[i] > skipped[i - 1]) {   // this step overflowed: the next step's scale is half
      if (i + 1 < scale.size()) EXPECT_EQ(scale[i + 1], scale[i] / 2) << "step " << i + 1;
      ++backoffs;
    }
    if (scale[i] == 2 * scale[i - 1]) ++growths;
  }
  EXPECT_GE(backoffs, 2);
  EXPECT_GE(growths, 1);
  EXPECT_LT(norm.size(), 24u);   // the overflowed steps report no finite norm
  const auto l = losses(d);
  EXPECT_LT(l.back(), l.front());   // the clean steps still train
}

TEST(Precision, TheLossScaleSurvivesResume) {
  TempDir a, b;
  const std::vector<std::string> fp16 = {"precision.dtype=fp16", "precision.initial_scale=1048576", "precision.growth_interval=2"};
  ASSERT_EQ(run_training(recipe(a.path(), 8, fp16), {.quiet = true}), 0);
  ASSERT_EQ(run_training(recipe(b.path(), 4, fp16), {.quiet = true}), 0);
  ASSERT_EQ(run_training(recipe(b.path(), 8, fp16), {.resume = true, .quiet = true}), 0);
  for (const char* key : {"loss", "loss_scale", "skipped_steps"}) {
    const auto x = colossal::test::metric_values(a / "metrics.jsonl", key), y = colossal::test::metric_values(b / "metrics.jsonl", key);
    ASSERT_EQ(y.size(), 8u) << key;
    for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(x[i], y[i]) << key << " at step " << i + 1;   // bit-identical
  }
}

TEST(Precision, BadScalerSettingsNameTheKey) {
  TempDir d;
  for (const auto& [set, message] : std::vector<std::pair<std::string, std::string>>{
           {"precision.growth_factor=1", "precision.growth_factor: = 1 would never let the scale grow"},
           {"precision.backoff_factor=1.5", "precision.backoff_factor: = 1.5 would not shrink the scale"},
           {"precision.backoff_factor=0", "precision.backoff_factor: = 0 would not shrink the scale"},
           {"precision.dtype=fp8", "precision.dtype: = \"fp8\" is not one of fp32 | bf16 | fp16"},
           {"precision.growth_interval=0", "precision.growth_interval: = 0 is out of range"}}) {
    const std::string e = colossal::test::error_of([&] { recipe(d.path(), 2, {set}); });
    EXPECT_NE(e.find(message), std::string::npos) << set << " -> " << e;
  }
}
