// GPT model: shapes, parameter count, HF names, KV-cache equivalence and a double-precision
// finite-difference gradient check of the whole model.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "models/gpt/gpt.h"
#include "src/core/error.h"
#include "src/engine/checkpoint.h"
#include "models/registry.h"
#include "src/nn/activation.h"
#include "src/nn/embedding_lookup.h"
#include "src/nn/kernel_choice.h"
#include "src/nn/lm_head_loss.h"

using namespace colossal;

namespace {

gpt::GptConfig tiny(double dropout = 0.0) {
  gpt::GptConfig c;
  c.n_layer = 2, c.n_head = 2, c.n_embd = 16, c.block_size = 24, c.vocab_size = 40, c.dropout = dropout;
  return c;
}

std::shared_ptr<gpt::Gpt> make(const gpt::GptConfig& c, uint64_t seed = 0) {
  at::manual_seed(seed);
  nn::LayerFactory f;
  auto m = std::make_shared<gpt::Gpt>(c, f);
  m->init_weights();
  return m;
}

}  // namespace

TEST(Gpt, LogitsHaveShapeBatchTimeVocab) {
  auto m = make(tiny());
  auto ids = at::randint(0, 40, {3, 7}, at::kLong);
  EXPECT_EQ(m->forward(ids).sizes(), (at::IntArrayRef{3, 7, 40}));
  nn::ForwardOptions o;
  o.last_only = true;
  EXPECT_EQ(m->forward(ids, o).sizes(), (at::IntArrayRef{3, 1, 40}));
}

TEST(Gpt, ParameterCountMatchesTheFormulaAndHfGpt2Small) {
  auto m = make(tiny());
  EXPECT_EQ(m->parameter_count(), gpt::parameter_count(tiny()));
  gpt::GptConfig small;   // GPT-2 124M with HF's vocabulary: 124,439,808 parameters
  small.vocab_size = 50257;
  EXPECT_EQ(gpt::parameter_count(small), 124439808);
}

TEST(Gpt, ParametersMapOntoHuggingFaceGpt2Names) {
  auto m = make(tiny());
  auto state = export_model_state(*m);
  std::map<std::string, std::vector<int64_t>> shapes;
  for (auto& t : state) shapes[t.name] = t.tensor.sizes().vec();
  EXPECT_EQ(shapes.size(), 4u + 12u * 2u);   // wte, wpe, ln_f (2) + 12 per block
  EXPECT_EQ(shapes["transformer.wte.weight"], (std::vector<int64_t>{40, 16}));
  EXPECT_EQ(shapes["transformer.wpe.weight"], (std::vector<int64_t>{24, 16}));
  EXPECT_EQ(shapes["transformer.h.1.attn.c_attn.weight"], (std::vector<int64_t>{16, 48}));   // Conv1D: [in, out]
  EXPECT_EQ(shapes["transformer.h.1.attn.c_attn.bias"], (std::vector<int64_t>{48}));
  EXPECT_EQ(shapes["transformer.h.0.mlp.c_fc.weight"], (std::vector<int64_t>{16, 64}));
  EXPECT_EQ(shapes["transformer.h.0.mlp.c_proj.weight"], (std::vector<int64_t>{64, 16}));
  EXPECT_EQ(shapes["transformer.ln_f.bias"], (std::vector<int64_t>{16}));
  EXPECT_EQ(shapes.count("lm_head.weight"), 0u);   // tied to wte, as transformers saves it
}

TEST(Gpt, ExportedStateLoadsIntoAFreshModelAndGivesTheSameLogits) {
  auto a = make(tiny(), 1), b = make(tiny(), 2);
  auto ids = at::randint(0, 40, {2, 9}, at::kLong);
  SafetensorsFile file;
  file.tensors = export_model_state(*a);
  file.tensors.push_back({"lm_head.weight", at::zeros({40, 16})});   // HF may include the tied head
  load_model_state(*b, HfWeights::from_file(file, "mem"));
  EXPECT_TRUE(at::allclose(a->forward(ids), b->forward(ids)));
}

TEST(Gpt, LoadingRejectsMissingUnexpectedAndMisshapenTensors) {
  auto m = make(tiny());
  SafetensorsFile file;
  file.tensors = export_model_state(*m);
  auto drop = file;
  drop.tensors.pop_back();
  EXPECT_THROW(load_model_state(*m, HfWeights::from_file(drop, "x")), Error);
  auto extra = file;
  extra.tensors.push_back({"transformer.h.9.ln_1.weight", at::ones({16})});
  EXPECT_THROW(load_model_state(*m, HfWeights::from_file(extra, "x")), Error);
  auto bad = file;
  bad.tensors[0].tensor = at::zeros({41, 16});
  EXPECT_THROW(load_model_state(*m, HfWeights::from_file(bad, "x")), Error);
}

TEST(Gpt, KvCacheDecodingMatchesFullForward) {
  auto m = make(tiny());
  m->eval();
  at::NoGradGuard g;
  auto ids = at::randint(0, 40, {2, 12}, at::kLong);
  auto full = m->forward(ids);                       // [2, 12, V]
  auto cache = m->make_cache(2, 12, c10::Device(c10::kCPU));
  nn::ForwardOptions o;
  o.cache = &cache;
  auto first = m->forward(ids.narrow(1, 0, 5), o);  // prefill 5 positions
  EXPECT_TRUE(at::allclose(first, full.narrow(1, 0, 5), 1e-5, 1e-5));
  for (int64_t t = 5; t < 12; ++t) {
    auto step = m->forward(ids.narrow(1, t, 1), o);
    EXPECT_TRUE(at::allclose(step.squeeze(1), full.select(1, t), 1e-5, 1e-5)) << "position " << t;
  }
  EXPECT_EQ(cache.length, 12);
}

TEST(Gpt, DropoutIsActiveInTrainingAndOffInEval) {
  auto m = make(tiny(0.5));
  auto ids = at::randint(0, 40, {2, 8}, at::kLong);
  m->eval();
  EXPECT_TRUE(at::equal(m->forward(ids), m->forward(ids)));
  m->train();
  EXPECT_FALSE(at::equal(m->forward(ids), m->forward(ids)));
}

TEST(Gpt, GradientsMatchFiniteDifferencesInDoublePrecision) {
  auto m = make(tiny());
  m->to(at::kDouble);
  m->train();   // dropout is 0, so train mode is deterministic
  auto ids = at::randint(0, 40, {2, 6}, at::kLong);
  auto targets = at::randint(0, 40, {2, 6}, at::kLong);
  auto loss = m->loss(ids, targets);
  loss.backward();
  const double eps = 1e-6;
  int checked = 0;
  at::NoGradGuard no_grad;
  for (auto& item : m->named_parameters()) {
    auto p = item.value();
    auto flat = p.view({-1});
    auto grad = p.grad().view({-1});
    // A few entries of every parameter tensor, spread across it.
    for (int64_t k = 0; k < 3; ++k) {
      const int64_t i = (k * 7919) % flat.numel();
      const double orig = flat[i].item<double>();
      flat[i] = orig + eps;
      const double up = m->loss(ids, targets).item<double>();
      flat[i] = orig - eps;
      const double down = m->loss(ids, targets).item<double>();
      flat[i] = orig;
      const double numeric = (up - down) / (2 * eps), analytic = grad[i].item<double>();
      EXPECT_NEAR(analytic, numeric, 1e-7 + 1e-5 * std::abs(numeric)) << item.key() << "[" << i << "]";
      ++checked;
    }
  }
  EXPECT_EQ(checked, 3 * 28);
}

TEST(Gpt, InitialLossIsNearUniform) {
  auto m = make(tiny());
  auto ids = at::randint(0, 40, {4, 16}, at::kLong);
  double loss = m->loss(ids, at::randint(0, 40, {4, 16}, at::kLong)).item<double>();
  EXPECT_NEAR(loss, std::log(40.0), 0.3);
}

TEST(ModelRegistry, UnknownFamilyNamesTheRecipeKey) {
  Recipe r = parse_recipe("[model]\nfamily = \"gtp\"\n", "r.toml");
  nn::LayerFactory f;
  try {
    build_model(r, f);
    FAIL();
  } catch (const RecipeError& e) {
    EXPECT_EQ(std::string(e.what()), "r.toml:2: [model] family: = \"gtp\" is not a known model family (valid: gpt, opt, bloom, bert, vit) (did you mean \"gpt\"?)");
  }
}

namespace {

// Runs `body` once with the head's products forced through our GEMM and once through ATen's.
void for_each_gemm_path(const std::function<void(const char*)>& body) {
  for (nn::KernelPath path : {nn::KernelPath::Ours, nn::KernelPath::Aten}) {
    nn::KernelPolicy policy;
    policy.gemm = path;
    nn::set_kernel_policy(policy);
    body(nn::kernel_path_name(path));
  }
  nn::set_kernel_policy({});
}

}  // namespace

TEST(LmHeadCrossEntropy, MatchesAtenCrossEntropyLossAndGradients) {
  at::manual_seed(3);
  // Widths that are multiples of 16 take the GEMM; V = 7 and 4099 are ATen's whatever the policy.
  for_each_gemm_path([](const char* gemm) {
    for (int64_t v : {7, 1024, 4099}) {
      auto x = at::randn({37, 32}).mul_(2).requires_grad_(true);
      auto w = at::randn({v, 32}).requires_grad_(true);
      auto targets = at::randint(0, v, {37}, at::kLong);
      targets[3] = -1;   // ignored positions contribute neither loss nor gradient
      targets[20] = -1;
      auto loss = nn::lm_head_cross_entropy(x, w, targets);
      (loss * 2.5).backward();   // a non-unit upstream gradient must scale the result

      auto xd = x.detach().to(at::kDouble).requires_grad_(true), wd = w.detach().to(at::kDouble).requires_grad_(true);
      auto ref = at::cross_entropy_loss(at::mm(xd, wd.t()), targets, {}, at::Reduction::Mean, /*ignore_index=*/-1);
      (ref * 2.5).backward();
      EXPECT_NEAR(loss.item<double>(), ref.item<double>(), 1e-5 * ref.item<double>()) << gemm << " V=" << v;
      EXPECT_LT((x.grad().to(at::kDouble) - xd.grad()).abs().max().item<double>(), 1e-5) << gemm << " V=" << v;
      EXPECT_LT((w.grad().to(at::kDouble) - wd.grad()).abs().max().item<double>(), 1e-5) << gemm << " V=" << v;
    }
  });
}

TEST(LmHeadCrossEntropy, GraphsAliveAtOnceKeepTheirOwnLogitsAndALaterStepReusesThem) {
  // The CPU logits are kept from step to step (lm_head_loss.cpp), but only taken again once no graph
  // holds them: a second forward while the first graph still waits for its backward must not write
  // over the first one's saved gradient.
  at::manual_seed(8);
  for_each_gemm_path([](const char* gemm) {
    auto w = at::randn({64, 32}).requires_grad_(true);
    const auto step = [&](const at::Tensor& x, const at::Tensor& targets) {
      auto ref_x = x.detach().to(at::kDouble).requires_grad_(true);
      at::cross_entropy_loss(at::mm(ref_x, w.detach().to(at::kDouble).t()), targets).backward();
      return ref_x.grad();
    };
    std::vector<at::Tensor> xs, targets, losses;
    for (int i = 0; i < 3; ++i) {
      xs.push_back(at::randn({24, 32}).requires_grad_(true));
      targets.push_back(at::randint(0, 64, {24}, at::kLong));
    }
    losses.push_back(nn::lm_head_cross_entropy(xs[0], w, targets[0]));
    losses.push_back(nn::lm_head_cross_entropy(xs[1], w, targets[1]));   // the first graph is still alive
    for (int i = 0; i < 2; ++i) {
      losses[i].backward();
      EXPECT_LT((xs[i].grad().to(at::kDouble) - step(xs[i], targets[i])).abs().max().item<double>(), 1e-5) << gemm << " graph " << i;
    }
    losses.clear();   // both released: the next forward takes the kept buffer
    nn::lm_head_cross_entropy(xs[2], w, targets[2]).backward();
    EXPECT_LT((xs[2].grad().to(at::kDouble) - step(xs[2], targets[2])).abs().max().item<double>(), 1e-5) << gemm;
  });
}

TEST(LmHeadCrossEntropy, AWeightWhoseGradIsABufferAccumulatesIntoItInPlace) {
  // As under FlatParams: the weight's .grad is a view of a flat buffer holding earlier micro-steps'
  // sums. The head's gradient must be added into that storage, scaled, and nothing else allocated.
  at::manual_seed(5);
  for_each_gemm_path([](const char* gemm) {
    for (double scale : {0.5, 1.0}) {   // 1: summed by our GEMM when chosen; otherwise one scaled addmm_
      auto x = at::randn({13, 16}).requires_grad_(true);
      auto w = at::randn({64, 16}).requires_grad_(true);
      auto targets = at::randint(0, 64, {13}, at::kLong);
      auto flat = at::randn({64 * 16 + 7});
      const auto before = flat.clone();
      w.mutable_grad() = flat.narrow(0, 7, 64 * 16).view({64, 16});
      const void* storage = w.grad().data_ptr();
      (nn::lm_head_cross_entropy(x, w, targets) * scale).backward();
      EXPECT_EQ(w.grad().data_ptr(), storage) << gemm;

      auto wr = w.detach().clone().requires_grad_(true);
      (at::cross_entropy_loss(at::mm(x.detach(), wr.t()), targets) * scale).backward();
      auto added = flat.narrow(0, 7, 64 * 16).view({64, 16}) - before.narrow(0, 7, 64 * 16).view({64, 16});
      EXPECT_LT((added - wr.grad()).abs().max().item<double>(), 1e-5) << gemm << " scale=" << scale;
      EXPECT_TRUE(at::equal(flat.narrow(0, 0, 7), before.narrow(0, 0, 7))) << gemm;   // the rest untouched
    }
  });
}

TEST(EmbeddingLookup, AddsItsRowsIntoTheTablesGradBufferInPlaceAndEqualsAtenOtherwise) {
  // Repeated ids (their rows sum), ids of two dimensions, an upstream gradient that is not ones.
  at::manual_seed(6);
  auto ids = at::tensor({3, 1, 3, 0, 7, 3}, at::kLong).view({2, 3});
  auto dy = at::randn({2, 3, 5}, at::kDouble);
  auto ref_w = at::randn({9, 5}, at::kDouble).requires_grad_(true);
  at::embedding(ref_w, ids).backward(dy);

  // Without a buffer: a gradient of its own, ATen's.
  auto w = ref_w.detach().clone().requires_grad_(true);
  auto y = nn::embedding_lookup(w, ids);
  EXPECT_TRUE(at::equal(y, at::embedding(ref_w.detach(), ids)));
  y.backward(dy);
  EXPECT_LT((w.grad() - ref_w.grad()).abs().max().item<double>(), 1e-12);

  // With a buffer holding an earlier sum (a tied head's): the rows are added into that storage, and
  // the rest of the buffer is untouched.
  auto flat = at::randn({9 * 5 + 4}, at::kDouble);
  const auto before = flat.clone();
  w.mutable_grad() = flat.narrow(0, 4, 45).view({9, 5});
  const void* storage = w.grad().data_ptr();
  nn::embedding_lookup(w, ids).backward(dy);
  EXPECT_EQ(w.grad().data_ptr(), storage);
  auto added = flat.narrow(0, 4, 45).view({9, 5}) - before.narrow(0, 4, 45).view({9, 5});
  EXPECT_LT((added - ref_w.grad()).abs().max().item<double>(), 1e-12);
  EXPECT_TRUE(at::equal(flat.narrow(0, 0, 4), before.narrow(0, 0, 4)));

  // Added row by row into the buffer itself, not summed apart and then added (a dense [V, C] table):
  // the two round differently when a row repeats. 1e16 + 1 rounds back to 1e16 (doubles there are 2
  // apart), twice; the dense sum would add 2 and give 1e16 + 2.
  auto big = at::zeros({3, 1}, at::kDouble);
  big[2][0] = 1e16;
  auto table = at::zeros({3, 1}, at::kDouble).requires_grad_(true);
  table.mutable_grad() = big;
  nn::embedding_lookup(table, at::tensor({2, 2}, at::kLong)).backward(at::ones({2, 1}, at::kDouble));
  EXPECT_EQ(table.grad()[2][0].item<double>(), 1e16);

  // No gradient wanted: a plain lookup, no graph.
  at::NoGradGuard no_grad;
  EXPECT_FALSE(nn::embedding_lookup(w, ids).requires_grad());
}

TEST(LmHeadCrossEntropy, DoublePrecisionPathAgreesToo) {
  auto x = at::randn({9, 8}, at::kDouble).requires_grad_(true);
  auto w = at::randn({11, 8}, at::kDouble).requires_grad_(true);
  auto targets = at::randint(0, 11, {9}, at::kLong);
  auto loss = nn::lm_head_cross_entropy(x, w, targets);
  loss.backward();
  auto xr = x.detach().clone().requires_grad_(true);
  auto ref = at::cross_entropy_loss(at::mm(xr, w.detach().t()), targets);
  ref.backward();
  EXPECT_NEAR(loss.item<double>(), ref.item<double>(), 1e-12);
  EXPECT_LT((x.grad() - xr.grad()).abs().max().item<double>(), 1e-12);
}

TEST(GeluTanh, CpuKernelMatchesTheDoublePrecisionFormulaForwardAndBackward) {
  nn::set_kernel_policy({nn::KernelPath::Auto, nn::KernelPath::Ours, nn::KernelPath::Auto});   // ours, not timed
  at::manual_seed(5);
  auto x = at::cat({at::randn({50000}) * 3, at::tensor({0.0f, 1e-6f, -1e-6f, 1e-3f, -1e-3f, 5.f, -5.f, 12.f, -12.f, 40.f, -40.f, 300.f, -300.f})});
  auto dy = at::randn_like(x);
  auto xf = x.clone().requires_grad_(true);
  auto y = nn::gelu_tanh(xf);
  y.backward(dy);
  auto xd = x.to(at::kDouble).requires_grad_(true);
  auto ref = at::gelu(xd, "tanh");   // double: the formula itself, to ~1e-16
  ref.backward(dy.to(at::kDouble));
  // Relative to the value, or absolute where the value is near zero.
  auto rel = [](const at::Tensor& a, const at::Tensor& b) { return ((a.to(at::kDouble) - b) / (b.abs() + 1)).abs().max().item<double>(); };
  // ATen's own float GELU, against the same reference, sets the bar (in float, tanh saturates near
  // |x| = 5 and the true gradient there, ~2e-6, rounds away: both err by that much).
  auto xa = x.clone().requires_grad_(true);
  auto ya = at::gelu(xa, "tanh");
  ya.backward(dy);
  EXPECT_LT(rel(y.detach(), ref.detach()), std::max(2 * rel(ya.detach(), ref.detach()), 1e-6));
  EXPECT_LT(rel(xf.grad(), xd.grad()), std::max(2 * rel(xa.grad(), xd.grad()), 1e-6));
  // Strided input, and other dtypes through ATen.
  auto m = at::randn({64, 48}).t();
  EXPECT_TRUE(at::allclose(nn::gelu_tanh(m), at::gelu(m, "tanh"), 1e-5, 1e-6));
  auto d = at::randn({7}, at::kDouble);
  EXPECT_TRUE(at::equal(nn::gelu_tanh(d), at::gelu(d, "tanh")));
  nn::set_kernel_policy({});
}

TEST(GptConfig, HfConfigFieldsAreHonouredOrRefusedNeverIgnored) {
  const gpt::GptConfig tiny{2, 4, 128, 128, 1024};
  const nlohmann::json good = gpt::to_hf_config(tiny);
  auto error_with = [&](const std::string& key, const nlohmann::json& value) {
    auto j = good;
    j[key] = value;
    try {
      gpt::from_hf_config(j, "dir/config.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_EQ(error_with("n_inner", nullptr), "(no error)");
  EXPECT_EQ(error_with("n_inner", 512), "(no error)");
  EXPECT_EQ(error_with("activation_function", "gelu_pytorch_tanh"), "(no error)");
  const std::pair<std::string, std::pair<nlohmann::json, std::string>> bad[] = {
      {"n_layer", {1000000000, "dir/config.json: \"n_layer\" = 1000000000 (expected a whole number in [1, 1024])"}},
      {"vocab_size", {1e12, "\"vocab_size\" = 1000000000000.0 (expected a whole number in [1, 16777216])"}},
      {"n_embd", {1e9, "\"n_embd\" = 1000000000.0"}},
      {"n_positions", {-4, "\"n_positions\" = -4"}},
      {"n_head", {"4", "\"n_head\" = \"4\""}},
      {"layer_norm_epsilon", {-1, "\"layer_norm_epsilon\" = -1 (expected a number in (0, 1))"}},
      {"resid_pdrop", {1.5, "\"resid_pdrop\" = 1.5 (expected a number in [0, 1))"}},
      {"activation_function", {"relu", "\"activation_function\" = \"relu\" is not supported (this GPT-2 uses the tanh GELU"}},
      {"tie_word_embeddings", {false, "\"tie_word_embeddings\" = false is not supported"}},
      {"n_inner", {1, "\"n_inner\" = 1 is not supported (the MLP is 4 x n_embd = 512 wide, or null)"}},
      {"scale_attn_by_inverse_layer_idx", {true, "\"scale_attn_by_inverse_layer_idx\" = true is not supported"}},
      {"n_ctx", {64, "\"n_ctx\" = 64 differs from n_positions = 128"}},
      {"model_type", {3, "\"model_type\" = 3 is not a name"}},
  };
  for (const auto& [key, expect] : bad) {
    const std::string e = error_with(key, expect.first);
    EXPECT_NE(e.find(expect.second), std::string::npos) << key << ": " << e;
  }
  try {
    gpt::from_hf_config(nlohmann::json::array({1, 2}), "dir/config.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dir/config.json: holds array, not a JSON object"), std::string::npos) << e.what();
  }
}
