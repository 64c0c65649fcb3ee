// AdamW over the chunk store's pieces against torch's clipping and torch::optim::AdamW (fp32, to 1e-6) and against the
// published update rule evaluated independently in double precision; gradient clipping; the schedule.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <cmath>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>

#include "kernels/cpu/adamw.h"
#include "src/core/recipe.h"
#include "src/optim/adamw.h"
#include "src/dist/group.h"
#include "src/memory/sum_of_squares.h"
#include "src/memory/zero_strategy.h"
#include "src/optim/schedule.h"

using namespace colossal;

namespace {

// A module with a decayed matrix and an undecayed bias.
struct Toy : nn::Module {
  explicit Toy(at::ScalarType dtype = at::kFloat) {
    w = register_parameter("w", at::randn({37, 11}, dtype));
    b = register_parameter("b", at::randn({37}, dtype));
  }
  at::Tensor w, b;
};

// Plain (stage 0) AdamW over one process's chunk store.
std::unique_ptr<memory::ZeroStrategy> plain(nn::Module& m, dist::Group& alone, double wd, int64_t chunk_numel = 1 << 20) {
  return std::make_unique<memory::ZeroStrategy>(m, memory::ZeroOptions{0, chunk_numel, wd}, alone,
                                                std::make_unique<optim::AdamW>(optim::AdamWOptions{0.9, 0.95, 1e-8}));
}

}  // namespace

TEST(AdamW, MatchesTorchClippingAndAdamWToOneInAMillionOverTwentySteps) {
  at::manual_seed(0);
  Toy ours, ref;
  {
    at::NoGradGuard g;
    ref.w.copy_(ours.w);
    ref.b.copy_(ours.b);
  }
  const double lr = 3e-3, wd = 0.1;
  dist::Group alone("dp");
  auto adamw = plain(ours, alone, wd, 256);   // w spans two chunks, b a third
  torch::optim::AdamW torch_opt({torch::optim::OptimizerParamGroup({ref.w}, std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(lr).betas({0.9, 0.95}).eps(1e-8).weight_decay(wd))),
                                 torch::optim::OptimizerParamGroup({ref.b}, std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(lr).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.0)))});
  for (int step = 0; step < 20; ++step) {
    auto x = at::randn({5, 11});
    ((at::matmul(x, ours.w.t()) + ours.b).pow(2).sum()).backward();
    ((at::matmul(x, ref.w.t()) + ref.b).pow(2).sum()).backward();
    // Clipping that acts on every step: ours folds the scale into the update's pass, torch scales the
    // gradients in place first.
    const double norm = adamw->clip_grad_norm(1.0);
    const double torch_norm = torch::nn::utils::clip_grad_norm_(std::vector<at::Tensor>{ref.w, ref.b}, 1.0);
    EXPECT_GT(norm, 1.0);
    EXPECT_NEAR(norm, torch_norm, 1e-5 * torch_norm) << "step " << step;
    adamw->step(lr);
    adamw->zero_grad();
    torch_opt.step();
    torch_opt.zero_grad();
    EXPECT_LT((ours.w - ref.w).abs().max().item<double>(), 1e-6) << "step " << step;
    EXPECT_LT((ours.b - ref.b).abs().max().item<double>(), 1e-6) << "step " << step;
  }
}

TEST(AdamW, DoublePrecisionKernelFollowsThePublishedUpdateRule) {
  // Loshchilov & Hutter's AdamW as written in torch.optim.AdamW's documentation, scalar by scalar.
  const int n = 1000;
  std::vector<double> p(n), m(n, 0), v(n, 0), ref_p(n), ref_m(n, 0), ref_v(n, 0);
  for (int i = 0; i < n; ++i) p[i] = ref_p[i] = std::sin(i * 0.37);
  const double lr = 1e-2, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.05;
  for (int t = 1; t <= 50; ++t) {
    std::vector<double> g(n);
    for (int i = 0; i < n; ++i) g[i] = std::cos(i * 0.11 + t) + 0.1 * p[i];
    kernels::adamw_step(p.data(), g.data(), m.data(), v.data(), n, {lr, b1, b2, eps, wd, t});
    for (int i = 0; i < n; ++i) {
      double gi = std::cos(i * 0.11 + t) + 0.1 * ref_p[i];
      ref_p[i] -= lr * wd * ref_p[i];
      ref_m[i] = b1 * ref_m[i] + (1 - b1) * gi;
      ref_v[i] = b2 * ref_v[i] + (1 - b2) * gi * gi;
      double m_hat = ref_m[i] / (1 - std::pow(b1, t)), v_hat = ref_v[i] / (1 - std::pow(b2, t));
      ref_p[i] -= lr * m_hat / (std::sqrt(v_hat) + eps);
    }
  }
  for (int i = 0; i < n; ++i) ASSERT_NEAR(p[i], ref_p[i], 1e-12) << i;
}

TEST(AdamW, LargeBuffersTakeTheParallelPathWithTheSameResult) {
  const int64_t n = (1 << 17) + 123;   // above the kernel's threading threshold
  auto p = at::randn({n}), g = at::randn({n}), m = at::zeros({n}), v = at::zeros({n});
  auto p2 = p.clone(), m2 = m.clone(), v2 = v.clone();
  kernels::adamw_step(p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(), n, {1e-3, 0.9, 0.99, 1e-8, 0.1, 1});
  for (int64_t s = 0; s < n; s += 1000) {   // the same update applied piecewise (serial path)
    int64_t len = std::min<int64_t>(1000, n - s);
    kernels::adamw_step(p2.data_ptr<float>() + s, g.data_ptr<float>() + s, m2.data_ptr<float>() + s, v2.data_ptr<float>() + s, len, {1e-3, 0.9, 0.99, 1e-8, 0.1, 1});
  }
  EXPECT_TRUE(at::equal(p, p2));
}

TEST(ChunkStore, ParametersAndGradientsAreViewsOfTheChunks) {
  at::manual_seed(1);
  Toy toy;
  auto before_w = toy.w.clone();
  dist::Group alone("dp");
  auto zs = plain(toy, alone, 0.1);
  const auto& store = zs->store();
  ASSERT_EQ(store.layout().chunks(), 1);
  EXPECT_TRUE(at::equal(toy.w, before_w));
  EXPECT_EQ(toy.w.data_ptr(), store.params()[0].data_ptr());
  EXPECT_EQ(toy.b.data_ptr<float>(), store.params()[0].data_ptr<float>() + 37 * 11);
  toy.w.sum().backward();
  toy.w.sum().backward();
  EXPECT_EQ(zs->store().full_grads()[0].sum().item<double>(), 2 * 37.0 * 11.0);   // accumulated in place
  zs->zero_grad();
  EXPECT_EQ(toy.w.grad().abs().sum().item<double>(), 0.0);
  // Weight decay follows the tensor: the matrix's pieces take it, the bias's do not.
  for (const auto& piece : store.layout().slots) EXPECT_EQ(piece.decay, piece.name == "w");
}

TEST(ChunkStore, ClippingScalesToTheMaximumNormLikeTorch) {
  Toy toy;
  dist::Group alone("dp");
  auto zs = plain(toy, alone, 0.0, 128);
  {
    at::NoGradGuard g;
    toy.w.grad().fill_(1.0);
    toy.b.grad().fill_(2.0);
  }
  const double expected = std::sqrt(37.0 * 11.0 + 37.0 * 4.0);
  EXPECT_NEAR(zs->clip_grad_norm(1.0), expected, 1e-4);
  EXPECT_NEAR(zs->clip_grad_norm(0.0), 1.0, 1e-5);   // now at the clipped norm
}

TEST(ChunkStore, AnAcceleratorsSumOfSquaresTakesEveryTensorAndDtypeAtOnce) {
  // The device path of the gradient norm (sum_of_squares.h), run here on host tensors: fp32 and bf16
  // shards of several sizes, one empty, against double precision.
  at::manual_seed(4);
  std::vector<at::Tensor> ts = {at::randn({1000}), at::randn({3, 7}).to(at::kBFloat16), at::empty({0}), at::randn({1 << 18}) * 1e-3};
  double ref = 0;
  for (const auto& t : ts) ref += t.to(at::kDouble).square().sum().item<double>();
  const at::Tensor got = memory::sum_of_squares(ts);
  EXPECT_EQ(got.scalar_type(), at::kDouble);
  EXPECT_EQ(got.dim(), 0);
  EXPECT_NEAR(got.item<double>(), ref, 1e-6 * ref);
  EXPECT_EQ(memory::sum_of_squares({}).item<double>(), 0.0);
}

TEST(Schedule, WarmsUpLinearlyThenDecaysByCosineToMinimum) {
  OptimConfig c;
  c.lr = 1.0, c.min_lr = 0.1, c.warmup_steps = 10, c.decay_steps = 110, c.schedule = "cosine";
  EXPECT_DOUBLE_EQ(optim::lr_at(c, 0), 0.1);
  EXPECT_DOUBLE_EQ(optim::lr_at(c, 9), 1.0);
  EXPECT_DOUBLE_EQ(optim::lr_at(c, 10), 1.0);
  EXPECT_NEAR(optim::lr_at(c, 60), 0.55, 1e-12);
  EXPECT_NEAR(optim::lr_at(c, 110), 0.1, 1e-12);
  EXPECT_NEAR(optim::lr_at(c, 500), 0.1, 1e-12);
  c.schedule = "linear";
  EXPECT_NEAR(optim::lr_at(c, 60), 0.55, 1e-12);
  c.schedule = "constant";
  EXPECT_DOUBLE_EQ(optim::lr_at(c, 60), 1.0);
}
