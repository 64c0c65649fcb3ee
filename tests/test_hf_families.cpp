// Every model family against Hugging Face transformers on its tiny random fixtures
// (scripts/fixtures/make_*.py): logits and one training step's gradients within 1e-4 in fp32, greedy
// generation with the KV cache token for token, and a saved state with the fixture's names, shapes,
// dtypes and bits that loads back bit-exactly. A family joins by adding its fixture to the list.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <filesystem>

#include "src/engine/checkpoint.h"
#include "tests/support/test_support.h"

using namespace colossal;
using test::fixture;
namespace fs = std::filesystem;
constexpr auto load = test::load_model;

namespace {

double max_diff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

class FamilyFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(FamilyFixture, LogitsMatchTransformers) {
  auto ref = load_safetensors(fixture(GetParam()) + "/reference.safetensors");
  auto model = load(fixture(GetParam()));
  at::NoGradGuard no_grad;
  auto logits = model->forward(ref.at("input_ids", "ref"));
  const auto& expected = ref.at("logits", "ref");
  ASSERT_EQ(logits.sizes(), expected.sizes());
  EXPECT_LT(max_diff(logits, expected), 1e-4);
}

TEST_P(FamilyFixture, OneStepGradientsMatchTransformersUnderHfNames) {
  auto ref = load_safetensors(fixture(GetParam()) + "/reference.safetensors");
  auto model = load(fixture(GetParam()));
  const auto ids = ref.at("input_ids", "ref");
  const int64_t t = ids.size(1);
  // transformers shifts inside: positions 0..T-2 predict tokens 1..T-1 (causal, so the last input
  // position changes nothing before it).
  auto loss = model->loss(ids.narrow(1, 0, t - 1), ids.narrow(1, 1, t - 1));
  EXPECT_NEAR(loss.item<double>(), ref.at("loss", "ref").item<double>(), 1e-5);
  loss.backward();
  test::expect_hf_gradients_match(*model, ref);
}

TEST_P(FamilyFixture, GreedyDecodingWithTheKvCacheMatchesTransformersGenerate) {
  auto ref = load_safetensors(fixture(GetParam()) + "/reference.safetensors");
  auto model = load(fixture(GetParam()));
  at::NoGradGuard no_grad;
  const auto prompt = ref.at("greedy.prompt", "ref");
  const auto expected = ref.at("greedy.output", "ref");
  const int64_t steps = expected.size(1) - prompt.size(1);
  auto cache = model->make_cache(1, expected.size(1), at::kCPU);
  nn::ForwardOptions o{.cache = &cache, .last_only = true};
  at::Tensor out = prompt, next = prompt;
  for (int64_t i = 0; i < steps; ++i) {
    next = model->forward(next, o).argmax(-1);   // [1, 1]
    out = at::cat({out, next}, 1);
  }
  EXPECT_TRUE(at::equal(out, expected)) << out << "\nexpected\n" << expected;
}

TEST_P(FamilyFixture, SavedStateHasTheFixturesNamesShapesAndDtypesAndReloadsBitExactly) {
  auto model = load(fixture(GetParam()));
  auto theirs = load_safetensors(fixture(GetParam()) + "/model.safetensors");
  auto ours = export_model_state(*model);
  std::map<std::string, at::Tensor> by_name;
  for (const auto& [n, t] : ours) by_name[n] = t;
  ASSERT_EQ(by_name.size(), theirs.tensors.size());
  for (const auto& [n, t] : theirs.tensors) {
    ASSERT_TRUE(by_name.count(n)) << n;
    EXPECT_EQ(by_name[n].sizes(), t.sizes()) << n;
    EXPECT_EQ(by_name[n].scalar_type(), t.scalar_type()) << n;
    EXPECT_TRUE(at::equal(by_name[n], t)) << n;   // loading then saving changes no bit
  }
  test::TempDir tmp;
  save_safetensors(tmp / "model.safetensors", ours);
  test::write_file(tmp / "config.json", model->hf_config().dump(2));
  auto again = load(tmp.path());
  auto a = model->named_parameters(), b = again->named_parameters();
  for (const auto& item : a) EXPECT_TRUE(at::equal(item.value(), b[item.key()])) << item.key();
}

INSTANTIATE_TEST_SUITE_P(Tiny, FamilyFixture, ::testing::Values("opt-tiny", "opt-tiny-postln", "bloom-tiny"), [](const auto& info) {
  std::string name = info.param;
  for (char& ch : name)
    if (ch == '-') ch = '_';
  return name;
});

// The loading errors every family gives the same way: a malformed config.json, a missing tensor, a
// shape mismatch and a truncated weights file each name the file and the tensor.
class FamilyErrors : public ::testing::TestWithParam<std::string> {
 protected:
  // A copy of the fixture to break; the error loading it.
  std::string error_loading() {
    return test::error_of([&] {
      nn::LayerFactory f;
      (void)load_pretrained(tmp.path(), f);
    });
  }
  void SetUp() override {
    for (const char* file : {"config.json", "model.safetensors"})
      fs::copy_file(fixture(GetParam()) + "/" + file, tmp / file);
    auto st = load_safetensors(fixture(GetParam()) + "/model.safetensors");
    for (const auto& [n, t] : st.tensors) tensors.push_back({n, t});
  }
  test::TempDir tmp;
  std::vector<NamedTensor> tensors;
};

TEST_P(FamilyErrors, MalformedConfigMissingOrMisshapenTensorAndTruncationAreNamed) {
  const std::string weights = tmp / "model.safetensors";
  const NamedTensor victim = tensors[tensors.size() / 2];
  std::vector<NamedTensor> fewer;
  for (const auto& t : tensors)
    if (t.name != victim.name) fewer.push_back(t);
  save_safetensors(weights, fewer);
  std::string e = error_loading();
  EXPECT_NE(e.find("tensor \"" + victim.name + "\" is missing"), std::string::npos) << e;

  std::vector<NamedTensor> misshapen = tensors;
  for (auto& t : misshapen)
    if (t.name == victim.name) t.tensor = at::zeros({t.tensor.numel() + 1});
  save_safetensors(weights, misshapen);
  e = error_loading();
  EXPECT_NE(e.find(weights + ": tensor \"" + victim.name + "\" has shape [" + std::to_string(victim.tensor.numel() + 1) + "]"),
            std::string::npos) << e;

  save_safetensors(weights, tensors);
  fs::resize_file(weights, fs::file_size(weights) - 100);
  e = error_loading();
  EXPECT_NE(e.find(weights), std::string::npos) << e;

  test::write_file(tmp / "config.json", "{\"model_type\": ");
  e = error_loading();
  EXPECT_NE(e.find(tmp / "config.json"), std::string::npos) << e;
}

INSTANTIATE_TEST_SUITE_P(Every, FamilyErrors, ::testing::Values("opt-tiny", "bloom-tiny", "bert-tiny", "bert-tiny-cls", "vit-tiny"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& ch : name)
                             if (ch == '-') ch = '_';
                           return name;
                         });

}  // namespace
