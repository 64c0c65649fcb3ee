// LAMB, LARS, Lion and SGD over the chunk store against their published update rules, evaluated here
// scalar by scalar in double precision. A tensor split across two ranks' shards, whose norms are then
// summed over both, is tests/test_dist.cpp's case (Zero.LayerWiseOptimizers...).
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <cmath>

#include "src/core/recipe.h"
#include "src/dist/group.h"
#include "src/memory/zero_strategy.h"
#include "src/optim/factory.h"

using namespace colossal;

namespace {

struct Toy : nn::Module {
  Toy() {
    w = register_parameter("w", at::randn({37, 11}, at::kDouble));   // decayed, layer-wise adapted
    b = register_parameter("b", at::randn({37}, at::kDouble));       // neither
  }
  at::Tensor w, b;
};

using Vec = std::vector<double>;
Vec values(const at::Tensor& t) {
  auto c = t.contiguous();
  return Vec(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}
double norm(const Vec& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return std::sqrt(s);
}

// One tensor's reference state and update, by the papers' formulas.
struct Ref {
  Vec w, s1, s2;
  bool decayed;
};

void lamb(Ref& r, const Vec& g, double lr, double wd, int t, double b1, double b2, double eps) {
  const size_t n = r.w.size();
  Vec u(n);
  for (size_t i = 0; i < n; ++i) {
    r.s1[i] = b1 * r.s1[i] + (1 - b1) * g[i];
    r.s2[i] = b2 * r.s2[i] + (1 - b2) * g[i] * g[i];
    const double mh = r.s1[i] / (1 - std::pow(b1, t)), vh = r.s2[i] / (1 - std::pow(b2, t));
    u[i] = mh / (std::sqrt(vh) + eps) + (r.decayed ? wd * r.w[i] : 0);
  }
  const double wn = norm(r.w), un = norm(u);
  const double phi = r.decayed && wn > 0 && un > 0 ? wn / un : 1;
  for (size_t i = 0; i < n; ++i) r.w[i] -= lr * phi * u[i];
}

void lars(Ref& r, const Vec& g, double lr, double wd, double mu, double eta, double eps) {
  const double d = r.decayed ? wd : 0;
  const double wn = norm(r.w), gn = norm(g);
  const double local = r.decayed && wn > 0 && gn > 0 ? eta * wn / (gn + d * wn + eps) : 1;
  for (size_t i = 0; i < r.w.size(); ++i) {
    r.s1[i] = mu * r.s1[i] + lr * local * (g[i] + d * r.w[i]);
    r.w[i] -= r.s1[i];
  }
}

void lion(Ref& r, const Vec& g, double lr, double wd, double b1, double b2) {
  for (size_t i = 0; i < r.w.size(); ++i) {
    const double c = b1 * r.s1[i] + (1 - b1) * g[i];
    const double sign = c > 0 ? 1 : (c < 0 ? -1 : 0);
    r.w[i] -= lr * (sign + (r.decayed ? wd : 0) * r.w[i]);
    r.s1[i] = b2 * r.s1[i] + (1 - b2) * g[i];
  }
}

void sgd(Ref& r, const Vec& g, double lr, double wd, double mu, bool nesterov) {
  for (size_t i = 0; i < r.w.size(); ++i) {
    const double d = g[i] + (r.decayed ? wd : 0) * r.w[i];
    r.s1[i] = mu * r.s1[i] + d;
    r.w[i] -= lr * (nesterov ? d + mu * r.s1[i] : r.s1[i]);
  }
}

// Twenty steps of `config` on the toy over its chunk store against `reference` on the same gradients.
void check_against_reference(const OptimConfig& config, const std::function<void(Ref&, const Vec&, double, int)>& reference) {
  at::manual_seed(3);
  Toy toy;
  std::vector<Ref> refs{{values(toy.w), Vec(37 * 11, 0), Vec(37 * 11, 0), true}, {values(toy.b), Vec(37, 0), Vec(37, 0), false}};
  dist::Group alone("dp");
  memory::ZeroStrategy zs(toy, memory::ZeroOptions{0, 1 << 20, config.weight_decay}, alone, optim::make_optimizer(config));
  for (int t = 1; t <= 20; ++t) {
    const double lr = 1e-2 * (1 + t % 3);
    const std::vector<at::Tensor> grads{at::randn({37, 11}, at::kDouble), at::randn({37}, at::kDouble) * 0.1};
    {
      at::NoGradGuard g;
      toy.w.grad().copy_(grads[0]);
      toy.b.grad().copy_(grads[1]);
    }
    zs.step(lr);
    for (size_t k = 0; k < 2; ++k) reference(refs[k], values(grads[k]), lr, t);
    for (size_t k = 0; k < 2; ++k) {
      const Vec got = values(k == 0 ? toy.w : toy.b);
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_NEAR(got[i], refs[k].w[i], 1e-12 * std::max(1.0, std::abs(refs[k].w[i]))) << config.name << " step " << t << " tensor " << k << " [" << i << "]";
    }
  }
}

OptimConfig config(const std::string& name) {
  OptimConfig c;
  c.name = name;
  c.weight_decay = 0.1;
  c.betas = {0.9, 0.99};
  c.eps = 1e-6;
  c.momentum = 0.9;
  c.trust_coefficient = 0.02;
  return c;
}

}  // namespace

TEST(Optimizers, LambFollowsYouEtAlsAlgorithmWithLayerWiseTrustRatios) {
  check_against_reference(config("lamb"), [](Ref& r, const Vec& g, double lr, int t) { lamb(r, g, lr, 0.1, t, 0.9, 0.99, 1e-6); });
}

TEST(Optimizers, LarsFollowsYouGitmanAndGinsburgsLocalLearningRates) {
  check_against_reference(config("lars"), [](Ref& r, const Vec& g, double lr, int) { lars(r, g, lr, 0.1, 0.9, 0.02, 1e-6); });
}

TEST(Optimizers, LionFollowsChenEtAlsSignUpdate) {
  check_against_reference(config("lion"), [](Ref& r, const Vec& g, double lr, int) { lion(r, g, lr, 0.1, 0.9, 0.99); });
}

TEST(Optimizers, SgdFollowsTorchsMomentumAndNesterov) {
  check_against_reference(config("sgd"), [](Ref& r, const Vec& g, double lr, int) { sgd(r, g, lr, 0.1, 0.9, false); });
  OptimConfig n = config("sgd");
  n.nesterov = true;
  check_against_reference(n, [](Ref& r, const Vec& g, double lr, int) { sgd(r, g, lr, 0.1, 0.9, true); });
}
