// The block-hook chain the engine puts around every transformer block: the order in which hooks see
// each block's forward and backward (nested: before in chain order, after in reverse), on a decoder and
// an encoder family, and gradients bit-identical with and without a chain.
#include <gtest/gtest.h>

#include <algorithm>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "models/registry.h"
#include "src/nn/block_hooks.h"
#include "src/nn/causal_lm.h"
#include "src/nn/encoder.h"
#include "tests/support/test_support.h"

using namespace colossal;

namespace {

struct Recorder : nn::BlockHook {
  explicit Recorder(std::string tag, std::vector<std::string>* log) : tag_(std::move(tag)), log_(log) {}
  void before_forward(int64_t b) override { log_->push_back(tag_ + "bf" + std::to_string(b)); }
  void after_forward(int64_t b) override { log_->push_back(tag_ + "af" + std::to_string(b)); }
  void before_backward(int64_t b) override { log_->push_back(tag_ + "bb" + std::to_string(b)); }
  void after_backward(int64_t b) override { log_->push_back(tag_ + "ab" + std::to_string(b)); }
  std::string tag_;
  std::vector<std::string>* log_;
};

ModelConfig tiny(const std::string& family) {
  ModelConfig m;
  m.family = family;
  m.n_layer = 2;
  m.n_head = 2;
  m.n_embd = 32;
  m.block_size = 16;
  m.vocab_size = 64;
  if (family == "bert") m.head = "mlm";
  return m;
}

std::shared_ptr<nn::Model> build(const std::string& family) {
  at::manual_seed(7);
  nn::LayerFactory f;
  auto m = build_model(tiny(family), f);
  m->train();
  return m;
}

at::Tensor loss_of(nn::Model& m, const at::Tensor& ids) {
  if (auto* lm = dynamic_cast<nn::CausalLM*>(&m)) return lm->loss(ids.narrow(1, 0, 15), ids.narrow(1, 1, 15));
  auto& mlm = dynamic_cast<nn::MaskedLM&>(m);
  return mlm.mlm_logits(mlm.encode({ids, {}, {}}).reshape({-1, 32})).logsumexp(-1).mean();
}

}  // namespace

TEST(BlockHooks, EachBlockIsSeenBeforeAndAfterItsForwardAndItsBackwardInNestedOrder) {
  for (const std::string family : {"gpt", "bert"}) {
    auto m = build(family);
    ASSERT_EQ(m->blocks().size(), 2u) << family;
    std::vector<std::string> log;
    auto hooks = std::make_shared<nn::BlockHooks>();
    hooks->add(std::make_shared<Recorder>("A.", &log));
    hooks->add(std::make_shared<Recorder>("B.", &log));
    m->set_block_hooks(hooks);
    at::manual_seed(1);
    const at::Tensor ids = at::randint(0, 64, {2, 16}, at::kLong);
    at::Tensor loss = loss_of(*m, ids);
    EXPECT_EQ(log, (std::vector<std::string>{"A.bf0", "B.bf0", "B.af0", "A.af0", "A.bf1", "B.bf1", "B.af1", "A.af1"})) << family;
    log.clear();
    loss.backward();
    EXPECT_EQ(log, (std::vector<std::string>{"A.bb1", "B.bb1", "B.ab1", "A.ab1", "A.bb0", "B.bb0", "B.ab0", "A.ab0"})) << family;
    // Without grad (eval, generation) only the forward calls come.
    log.clear();
    {
      at::NoGradGuard no_grad;
      loss_of(*m, ids);
    }
    EXPECT_EQ(log.size(), 8u);
    EXPECT_EQ(log.front(), "A.bf0");
  }
}

TEST(BlockHooks, AChainLeavesTheGradientsBitIdentical) {
  for (const std::string family : {"gpt", "bert"}) {
    auto plain = build(family), hooked = build(family);
    std::vector<std::string> log;
    auto hooks = std::make_shared<nn::BlockHooks>();
    hooks->add(std::make_shared<Recorder>("", &log));
    hooked->set_block_hooks(hooks);
    at::manual_seed(2);
    const at::Tensor ids = at::randint(0, 64, {2, 16}, at::kLong);
    loss_of(*plain, ids).backward();
    loss_of(*hooked, ids).backward();
    auto a = plain->named_parameters(), b = hooked->named_parameters();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(at::equal(a[i].value().grad(), b[i].value().grad())) << family << " " << a[i].key();
  }
}

namespace {

// A model of `family` with dropout on the residual stream and on attention.
std::shared_ptr<nn::Model> build_dropping(const std::string& family) {
  at::manual_seed(7);
  ModelConfig c = tiny(family);
  c.dropout = 0.1;
  nn::LayerFactory f;
  auto m = build_model(c, f);
  m->train();
  return m;
}

}  // namespace

TEST(BlockHooks, RecomputedBlocksGiveBitIdenticalGradientsWithDropoutAndLeaveTheGeneratorInStep) {
  // Full recompute and every other block, against keeping every activation: the same masks (the
  // rerun replays the generator), the same gradients to the bit, and the generator where it would be.
  for (const std::string family : {"gpt", "bert"})
    for (const std::vector<bool>& which : {std::vector<bool>{true, true}, std::vector<bool>{true, false}}) {
      auto plain = build_dropping(family), rerun = build_dropping(family);
      std::vector<std::string> log;
      auto hooks = std::make_shared<nn::BlockHooks>();
      hooks->add(std::make_shared<Recorder>("", &log));
      hooks->set_recompute(which);
      rerun->set_block_hooks(hooks);
      const at::Tensor ids = at::randint(0, 64, {2, 16}, at::kLong);
      at::manual_seed(3);
      at::Tensor a = loss_of(*plain, ids);
      a.backward();
      const at::Tensor after_plain = at::randn({4});
      at::manual_seed(3);
      at::Tensor b = loss_of(*rerun, ids);
      b.backward();
      const at::Tensor after_rerun = at::randn({4});
      const std::string name = family + (which[1] ? " full" : " every 2");
      EXPECT_TRUE(at::equal(a, b)) << name;
      EXPECT_TRUE(at::equal(after_plain, after_rerun)) << name << ": the generator moved on differently";
      auto pa = plain->named_parameters(), pb = rerun->named_parameters();
      ASSERT_EQ(pa.size(), pb.size());
      for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(at::equal(pa[i].value().grad(), pb[i].value().grad())) << name << " " << pa[i].key();
      // the chain's hooks still see every block's backward, in order, around the rerun
      EXPECT_EQ(std::count(log.begin(), log.end(), "bb0"), 1) << name;
      EXPECT_EQ(std::count(log.begin(), log.end(), "ab0"), 1) << name;
    }
}
