// OPT against Hugging Face transformers: HF directories in every weight format, weights saved without
// the model prefix, the errors a broken directory gives and OPT's config (logits, gradients, greedy
// generation and the saved layout of its fixtures are checked with every family's in test_hf_families).
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <filesystem>

#include "models/opt/opt.h"
#include "models/registry.h"
#include "src/core/error.h"
#include "src/engine/checkpoint.h"
#include "src/nn/kernel_choice.h"
#include "tests/support/test_support.h"

using namespace colossal;
using test::fixture;
constexpr auto load = test::load_model;
namespace fs = std::filesystem;

namespace {

// The largest elementwise difference, for messages.
double max_diff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

TEST(OptFormats, ShardedSafetensorsOldBinAndShardedBinGiveTheSameLogits) {
  auto ref = load_safetensors(fixture("opt-tiny") + "/reference.safetensors");
  at::NoGradGuard no_grad;
  for (const char* dir : {"sharded", "bin", "bin-sharded"}) {
    auto model = load(fixture("opt-tiny-formats/") + dir);
    EXPECT_LT(max_diff(model->forward(ref.at("input_ids", "ref")), ref.at("logits", "ref")), 1e-4) << dir;
  }
}

TEST(OptFormats, WeightsSavedFromTheBareModelWithoutItsPrefixLoad) {
  // facebook/opt-* checkpoints name tensors "decoder.layers.0..." (saved from OPTModel).
  test::TempDir tmp;
  auto model = load(fixture("opt-tiny"));
  auto state = export_model_state(*model);
  for (auto& t : state) t.name = t.name.substr(std::string("model.").size());
  save_safetensors(tmp / "model.safetensors", state);
  fs::copy_file(fixture("opt-tiny") + "/config.json", tmp / "config.json");
  auto again = load(tmp.path());
  auto ids = at::randint(0, 384, {1, 7}, at::kLong);
  at::NoGradGuard no_grad;
  EXPECT_TRUE(at::equal(model->forward(ids), again->forward(ids)));
}

// A copy of the opt-tiny fixture whose `file` is replaced by `content`, or changed by `edit`.
struct BrokenDir {
  test::TempDir tmp;
  BrokenDir() {
    for (const char* f : {"config.json", "model.safetensors"}) fs::copy_file(fixture("opt-tiny") + "/" + f, tmp / f);
  }
  std::string error() {
    return test::error_of([&] { load(tmp.path()); });
  }
};

void save_without(const std::string& path, const std::string& drop, const std::function<void(NamedTensor&)>& edit = {}) {
  auto file = load_safetensors(path);
  std::vector<NamedTensor> kept;
  for (auto& t : file.tensors) {
    if (t.name == drop) continue;
    if (edit) edit(t);
    kept.push_back(t);
  }
  save_safetensors(path, kept);
}

TEST(OptErrors, MalformedConfigNamesTheFile) {
  BrokenDir d;
  test::write_file(d.tmp / "config.json", "{\"model_type\": \"opt\", \"hidden_size\": 32,");
  EXPECT_NE(d.error().find(d.tmp / "config.json"), std::string::npos) << d.error();
  EXPECT_NE(d.error().find("not valid JSON"), std::string::npos) << d.error();
}

TEST(OptErrors, UnknownModelTypeListsTheSupportedOnes) {
  BrokenDir d;
  test::write_file(d.tmp / "config.json", "{\"model_type\": \"mamba\"}");
  EXPECT_NE(d.error().find("model_type \"mamba\" is not supported (valid: gpt2, opt"), std::string::npos) << d.error();
}

TEST(OptErrors, MissingTensorIsNamed) {
  BrokenDir d;
  save_without(d.tmp / "model.safetensors", "model.decoder.layers.1.self_attn.k_proj.weight");
  EXPECT_NE(d.error().find("tensor \"model.decoder.layers.1.self_attn.k_proj.weight\" is missing"), std::string::npos) << d.error();
  EXPECT_NE(d.error().find(d.tmp / "model.safetensors"), std::string::npos) << d.error();
}

TEST(OptErrors, ShapeMismatchNamesTensorAndBothShapes) {
  BrokenDir d;
  save_without(d.tmp / "model.safetensors", "", [](NamedTensor& t) {
    if (t.name == "model.decoder.layers.0.fc1.weight") t.tensor = at::zeros({64, 31});
  });
  EXPECT_NE(d.error().find("\"model.decoder.layers.0.fc1.weight\" has shape [64, 31] but the model expects [64, 32]"),
            std::string::npos) << d.error();
}

TEST(OptErrors, TruncatedWeightsFileIsNamed) {
  BrokenDir d;
  const std::string path = d.tmp / "model.safetensors";
  fs::resize_file(path, fs::file_size(path) - 1000);
  EXPECT_NE(d.error().find(path), std::string::npos) << d.error();
}

TEST(OptErrors, TruncatedBinAndMissingShardAreNamed) {
  test::TempDir tmp;
  fs::copy(fixture("opt-tiny-formats/bin-sharded"), tmp.path(), fs::copy_options::recursive);
  const std::string shard = tmp / "pytorch_model-00002-of-00002.bin";
  fs::resize_file(shard, fs::file_size(shard) / 2);
  auto e = test::error_of([&] { load(tmp.path()); });
  EXPECT_NE(e.find(shard), std::string::npos) << e;
  fs::remove(shard);
  e = test::error_of([&] { load(tmp.path()); });
  EXPECT_NE(e.find("shard pytorch_model-00002-of-00002.bin is missing"), std::string::npos) << e;
}

TEST(OptConfig, RecipeKeysOptCannotTakeAreRefusedAtTheirLine) {
  auto r = parse_recipe("[model]\nfamily = \"opt\"\nn_layer = 2\nn_head = 2\nn_embd = 16\nlayer_norm_eps = 1e-6\n", "x.toml");
  auto e = test::error_of([&] { check_model_recipe(r); });
  EXPECT_NE(e.find("x.toml:6: [model] layer_norm_eps"), std::string::npos) << e;
}

TEST(OptConfig, HfConfigRoundTripsThroughTheRecipeForm) {
  const auto j = nlohmann::json::parse(test::read_file(fixture("opt-tiny-postln") + "/config.json"));
  const auto c = opt::from_hf_config(j, "config.json");
  EXPECT_EQ(c.embed_dim, 16);
  EXPECT_FALSE(c.pre_norm);
  const auto back = opt::from_recipe(opt::to_model_config(c));
  EXPECT_EQ(opt::to_hf_config(back), opt::to_hf_config(c));
  nn::LayerFactory f;
  opt::Opt m(c, f);
  EXPECT_EQ(m.parameter_count(), opt::parameter_count(c));
}

}  // namespace

namespace {

TEST(OptConfig, PublishedShapesCountAsTransformersDoes) {
  // transformers: sum(p.numel() for p in OPTForCausalLM(facebook/opt-125m config).parameters())
  EXPECT_EQ(count_parameters(load_recipe(test::source_dir() + "/recipes/opt-125m.toml").model), 125239296);
}

}  // namespace
