// BLOOM beyond what every family shares (test_hf_families): ALiBi's slopes against transformers' for
// head counts that are and are not powers of two, batched generation with left padding (ALiBi under a
// padding mask and a KV cache) against one prompt at a time, the config fields BLOOM refuses, and the
// published shapes' parameter counts.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "models/bloom/bloom.h"
#include "models/registry.h"
#include "src/engine/checkpoint.h"
#include "src/engine/generator.h"
#include "src/nn/alibi.h"
#include "tests/support/test_support.h"

using namespace colossal;
using test::fixture;

namespace {

TEST(Alibi, SlopesMatchTransformersForEveryHeadCount) {
  const auto ref = load_safetensors(fixture("bloom-tiny/reference.safetensors"));
  int compared = 0;
  for (const auto& [name, expected] : ref.tensors) {
    if (name.rfind("alibi.slopes.", 0) != 0) continue;
    const int64_t heads = std::stoll(name.substr(13));
    const auto ours = nn::alibi_slopes(heads);
    ASSERT_EQ(ours.sizes(), expected.sizes()) << name;
    EXPECT_LT((ours - expected).abs().max().item<double>(), 1e-7) << name;
    ++compared;
  }
  EXPECT_EQ(compared, 9);
}

TEST(Alibi, BiasIsTheSlopeTimesTheDistanceAndMasksTheFuture) {
  const auto bias = nn::alibi_bias(at::tensor({0.5f, 0.25f}), 2, 1, 3, {}, true);   // queries at 1, 2 over keys 0..2
  ASSERT_EQ(bias.sizes(), (std::vector<int64_t>{1, 2, 2, 3}));
  EXPECT_FLOAT_EQ(bias[0][0][0][0].item<float>(), -0.5f);    // head 0, query 1, key 0
  EXPECT_FLOAT_EQ(bias[0][1][1][0].item<float>(), -0.5f);    // head 1, query 2, key 0: 0.25 * -2
  EXPECT_TRUE(std::isinf(bias[0][0][0][2].item<float>()));   // query 1 cannot see key 2
  EXPECT_FLOAT_EQ(bias[0][0][1][2].item<float>(), 0.0f);
}

TEST(BloomGeneration, ABatchWithLeftPaddingGeneratesWhatEachPromptDoesAlone) {
  nn::LayerFactory f;
  auto model = nn::model_as<nn::CausalLM>(load_pretrained(fixture("bloom-tiny"), f), "the test");
  const auto tok = Tokenizer::load(fixture("bloom-tiny"));
  Generator gen(model, tok, at::kCPU);
  SamplingConfig greedy;
  greedy.greedy = true;
  greedy.max_tokens = 8;
  const std::vector<std::string> prompts = {"In the beginning God created the heaven", "And God said"};
  const auto batch = gen.generate(prompts, greedy);
  ASSERT_NE(tok.encode(prompts[0]).size(), tok.encode(prompts[1]).size());   // the batch is ragged
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto alone = gen.generate({prompts[i]}, greedy);
    EXPECT_EQ(batch[i].text, alone[0].text) << prompts[i];
    EXPECT_EQ(batch[i].completion_tokens, alone[0].completion_tokens) << prompts[i];
  }
}

TEST(BloomConfig, HfFieldsItCannotBuildAreRefusedByName) {
  auto j = nlohmann::json::parse(test::read_file(fixture("bloom-tiny/config.json")));
  j["apply_residual_connection_post_layernorm"] = true;
  auto e = test::error_of([&] { bloom::from_hf_config(j, "config.json"); });
  EXPECT_NE(e.find("config.json: \"apply_residual_connection_post_layernorm\" = true is not supported"), std::string::npos) << e;
  j = nlohmann::json::parse(test::read_file(fixture("bloom-tiny/config.json")));
  j.erase("hidden_size");
  j["n_embed"] = 48;   // bigscience/bloom-*'s older spelling
  EXPECT_EQ(bloom::from_hf_config(j, "config.json").n_embd, 48);
}

TEST(BloomConfig, RecipeKeysBloomCannotTakeAreRefusedAtTheirLine) {
  auto r = parse_recipe("[model]\nfamily = \"bloom\"\nn_layer = 2\nn_head = 2\nn_embd = 16\nn_inner = 40\n", "x.toml");
  auto e = test::error_of([&] { check_model_recipe(r); });
  EXPECT_NE(e.find("x.toml:6: [model] n_inner: = 40 is not BLOOM's MLP width, 4 x n_embd (valid: 0 or 64)"), std::string::npos) << e;
}

TEST(BloomConfig, PublishedShapesCountAsTransformersDoes) {
  // The model cards' counts: sum(p.numel() for p in BloomForCausalLM(config).parameters()).
  EXPECT_EQ(count_parameters(load_recipe(test::source_dir() + "/recipes/bloom-560m.toml").model), 559214592);
  EXPECT_EQ(count_parameters(load_recipe(test::source_dir() + "/recipes/bloom-176b.toml").model), 176247271424);
  nn::LayerFactory f;
  const auto c = bloom::from_hf_config(nlohmann::json::parse(test::read_file(fixture("bloom-tiny/config.json"))), "config.json");
  EXPECT_EQ(bloom::Bloom(c, f).parameter_count(), bloom::parameter_count(c));
}

}  // namespace
