// The masked-LM collator: BERT's proportions (15% chosen; of those 80% [MASK], 10% random, 10% kept),
// specials never chosen, labels only where chosen, and the same batch for the same seed.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "src/data/mlm_masking.h"

using namespace colossal;

namespace {

constexpr int kPad = 0, kCls = 2, kSep = 3, kMask = 4;

MlmSpec spec() {
  MlmSpec s;
  s.cls = kCls, s.sep = kSep, s.mask = kMask;
  s.specials = {kPad, kSep};
  s.vocab_size = 1000;
  return s;
}

at::Tensor windows(int64_t b, int64_t l) { return at::randint(5, 1000, {b, l}, at::kLong); }

TEST(MlmMasking, ProportionsAreBerts) {
  at::manual_seed(0);
  const auto w = windows(64, 510);
  const auto m = mask_tokens(w, spec(), 7);
  ASSERT_EQ(m.inputs.sizes(), (std::vector<int64_t>{64, 512}));
  const auto original = at::cat({at::full({64, 1}, kCls, at::kLong), w, at::full({64, 1}, kSep, at::kLong)}, 1);
  const auto chosen = m.labels.ge(0);
  const double n = chosen.sum().item<double>(), positions = 64.0 * 510;
  EXPECT_NEAR(n / positions, 0.15, 0.01);
  EXPECT_TRUE(at::equal(m.labels.masked_select(chosen), original.masked_select(chosen)));   // labels are the originals
  const double masked = m.inputs.eq(kMask).logical_and(chosen).sum().item<double>();
  const double kept = m.inputs.eq(original).logical_and(chosen).sum().item<double>();
  EXPECT_NEAR(masked / n, 0.8, 0.02);
  EXPECT_NEAR(kept / n, 0.1 + 0.1 / 1000, 0.02);   // the 10% kept, plus random draws that hit the original
  EXPECT_TRUE(at::equal(m.inputs.masked_select(chosen.logical_not()), original.masked_select(chosen.logical_not())));
  EXPECT_TRUE(at::equal(m.inputs.select(1, 0), at::full({64}, kCls, at::kLong)));
  EXPECT_TRUE(at::equal(m.inputs.select(1, 511), at::full({64}, kSep, at::kLong)));
}

TEST(MlmMasking, SpecialsAreNeverChosen) {
  at::manual_seed(1);
  auto w = windows(16, 64);
  w.narrow(1, 20, 5).fill_(kSep);   // a document boundary inside the window
  w.narrow(1, 50, 14).fill_(kPad);
  const auto m = mask_tokens(w, spec(), 3);
  EXPECT_FALSE(m.labels.narrow(1, 21, 5).ge(0).any().item<bool>());
  EXPECT_FALSE(m.labels.narrow(1, 51, 15).ge(0).any().item<bool>());
  EXPECT_FALSE(m.labels.select(1, 0).ge(0).any().item<bool>());
}

TEST(MlmMasking, TheSameSeedGivesTheSameBatchAndAnotherSeedAnother) {
  const auto w = windows(8, 100);
  const auto a = mask_tokens(w, spec(), batch_seed(1337, 64, 0)), b = mask_tokens(w, spec(), batch_seed(1337, 64, 0));
  const auto c = mask_tokens(w, spec(), batch_seed(1337, 72, 0)), d = mask_tokens(w, spec(), batch_seed(1337, 64, 1));
  EXPECT_TRUE(at::equal(a.inputs, b.inputs) && at::equal(a.labels, b.labels));
  EXPECT_FALSE(at::equal(a.labels, c.labels));
  EXPECT_FALSE(at::equal(a.labels, d.labels));
}

TEST(MlmMasking, ATinyBatchStillScoresOnePosition) {
  const auto w = at::full({1, 2}, 7, at::kLong);
  for (uint64_t seed = 0; seed < 50; ++seed) EXPECT_GE(mask_tokens(w, spec(), seed).labels.ge(0).sum().item<int64_t>(), 1);
}

}  // namespace
