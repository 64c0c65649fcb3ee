// BERT against Hugging Face transformers on the fixtures of scripts/fixtures/make_bert.py: the
// masked-LM model (bert-tiny) and the sequence classifier (bert-tiny-cls) on a padded batch with two
// segments. Hidden states, logits, the pooler, the loss and every gradient within 1e-4 in fp32; saved
// states equal the fixtures bit for bit; BertForPreTraining-style checkpoints (gamma/beta, pooler,
// next-sentence head) load into the masked-LM model.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "models/bert/bert.h"
#include "models/registry.h"
#include "src/engine/checkpoint.h"
#include "tests/support/test_support.h"

using namespace colossal;
using test::fixture;

namespace {

double max_diff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

std::shared_ptr<nn::Model> load(const std::string& dir) {
  nn::LayerFactory f;
  auto m = load_pretrained(dir, f);
  m->eval();
  return m;
}

nn::EncoderInputs inputs_of(const SafetensorsFile& ref) {
  return {ref.at("input_ids", "ref"), ref.at("token_type_ids", "ref"), ref.at("attention_mask", "ref")};
}

// The masked-LM loss as the masked_lm task computes it: the head on the scored positions only.
at::Tensor mlm_loss(nn::MaskedLM& m, const nn::EncoderInputs& in, const at::Tensor& labels) {
  auto h = m.encode(in);
  const auto flat = labels.reshape({-1});
  const auto scored = flat.ge(0).nonzero().squeeze(1);
  return at::cross_entropy_loss(m.mlm_logits(h.reshape({-1, h.size(-1)}).index_select(0, scored)), flat.index_select(0, scored));
}

TEST(BertMaskedLM, HiddenStatesAndLogitsMatchTransformersOnAPaddedBatch) {
  auto ref = load_safetensors(fixture("bert-tiny") + "/reference.safetensors");
  auto model = load(fixture("bert-tiny"));
  auto& m = nn::model_as<nn::MaskedLM>(*model, "the test");
  at::NoGradGuard no_grad;
  auto h = m.encode(inputs_of(ref));
  EXPECT_LT(max_diff(h, ref.at("hidden", "ref")), 1e-4);
  auto logits = m.mlm_logits(h.reshape({-1, h.size(-1)})).view({h.size(0), h.size(1), -1});
  ASSERT_EQ(logits.sizes(), ref.at("logits", "ref").sizes());
  EXPECT_LT(max_diff(logits, ref.at("logits", "ref")), 1e-4);
}

TEST(BertMaskedLM, LossAndEveryGradientMatchTransformers) {
  auto ref = load_safetensors(fixture("bert-tiny") + "/reference.safetensors");
  auto model = load(fixture("bert-tiny"));
  auto loss = mlm_loss(nn::model_as<nn::MaskedLM>(*model, "the test"), inputs_of(ref), ref.at("labels", "ref"));
  EXPECT_NEAR(loss.item<double>(), ref.at("loss", "ref").item<double>(), 1e-5);
  loss.backward();
  test::expect_hf_gradients_match(*model, ref);
}

TEST(BertMaskedLM, PaddingChangesNothingForTheRealTokens) {
  auto ref = load_safetensors(fixture("bert-tiny") + "/reference.safetensors");
  auto model = load(fixture("bert-tiny"));
  auto& m = nn::model_as<nn::MaskedLM>(*model, "the test");
  at::NoGradGuard no_grad;
  const auto in = inputs_of(ref);
  const int64_t real = in.attention_mask[1].sum().item<int64_t>();
  ASSERT_LT(real, in.ids.size(1));   // the fixture's second row is padded
  auto padded = m.encode(in)[1].narrow(0, 0, real);
  auto alone = m.encode({in.ids.narrow(0, 1, 1).narrow(1, 0, real), in.token_types.narrow(0, 1, 1).narrow(1, 0, real), {}})[0];
  EXPECT_LT(max_diff(padded, alone), 1e-5);
}

TEST(BertClassifier, PoolerLogitsLossAndEveryGradientMatchTransformers) {
  auto ref = load_safetensors(fixture("bert-tiny-cls") + "/reference.safetensors");
  auto model = load(fixture("bert-tiny-cls"));
  auto& m = dynamic_cast<bert::BertForClassification&>(*model);
  EXPECT_EQ(m.num_labels(), 3);
  {
    at::NoGradGuard no_grad;
    EXPECT_LT(max_diff(m.pooled(inputs_of(ref)), ref.at("pooled", "ref")), 1e-4);
    EXPECT_LT(max_diff(m.classify(inputs_of(ref)), ref.at("logits", "ref")), 1e-4);
  }
  auto loss = at::cross_entropy_loss(m.classify(inputs_of(ref)), ref.at("labels", "ref"));
  EXPECT_NEAR(loss.item<double>(), ref.at("loss", "ref").item<double>(), 1e-5);
  loss.backward();
  test::expect_hf_gradients_match(*model, ref);
}

class BertFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(BertFixture, SavedStateHasTheFixturesNamesShapesAndBitsAndReloadsBitExactly) {
  auto model = load(fixture(GetParam()));
  auto theirs = load_safetensors(fixture(GetParam()) + "/model.safetensors");
  std::map<std::string, at::Tensor> ours;
  for (const auto& [n, t] : export_model_state(*model)) ours[n] = t;
  ASSERT_EQ(ours.size(), theirs.tensors.size());
  for (const auto& [n, t] : theirs.tensors) {
    ASSERT_TRUE(ours.count(n)) << n;
    EXPECT_EQ(ours[n].scalar_type(), t.scalar_type()) << n;
    EXPECT_TRUE(at::equal(ours[n], t)) << n;
  }
  // The config we write reads back as the same model, head and labels included.
  const auto written = model->hf_config();
  const auto original = test::read_json_file(fixture(GetParam()) + "/config.json");
  for (const char* key : {"architectures", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                          "max_position_embeddings", "type_vocab_size", "vocab_size", "layer_norm_eps", "hidden_act", "pad_token_id"})
    EXPECT_EQ(written[key], original[key]) << key;
  // Class names come back through the starting directory's config when a run saves (config_for_save).
  if (original.contains("id2label")) EXPECT_EQ(written["id2label"].size(), original["id2label"].size());
  test::TempDir tmp;
  save_safetensors(tmp / "model.safetensors", export_model_state(*model));
  test::write_file(tmp / "config.json", written.dump(2));
  auto again = load(tmp.path());
  auto a = model->named_parameters(), b = again->named_parameters();
  for (const auto& item : a) EXPECT_TRUE(at::equal(item.value(), b[item.key()])) << item.key();
}

TEST_P(BertFixture, ParameterCountFromTheConfigEqualsTheModels) {
  auto model = load(fixture(GetParam()));
  const auto config = test::read_json_file(fixture(GetParam()) + "/config.json");
  const int64_t in_file = [&] {
    int64_t n = 0;
    for (const auto& [name, t] : load_safetensors(fixture(GetParam()) + "/model.safetensors").tensors) n += t.numel();
    return n;
  }();
  EXPECT_EQ(model->parameter_count(), in_file);
  EXPECT_EQ(count_parameters(model_config_from_hf(config, "config.json")), in_file);
}

INSTANTIATE_TEST_SUITE_P(Tiny, BertFixture, ::testing::Values("bert-tiny", "bert-tiny-cls"), [](const auto& info) {
  std::string name = info.param;
  for (char& ch : name)
    if (ch == '-') ch = '_';
  return name;
});

TEST(BertCheckpoints, APreTrainingCheckpointWithGammaBetaAndUnusedHeadsLoadsIntoTheMaskedLM) {
  // bert-base-uncased's layout: BertForPreTraining's tensors (pooler, next-sentence head, the tied
  // decoder), LayerNorm parameters named gamma and beta, and the position_ids buffer.
  auto theirs = load_safetensors(fixture("bert-tiny") + "/model.safetensors");
  std::vector<NamedTensor> legacy;
  for (const auto& [n, t] : theirs.tensors) {
    std::string name = n;
    if (name.ends_with("LayerNorm.weight")) name.replace(name.size() - 6, 6, "gamma");
    if (name.ends_with("LayerNorm.bias")) name.replace(name.size() - 4, 4, "beta");
    legacy.push_back({name, t});
  }
  legacy.push_back({"bert.pooler.dense.weight", at::randn({32, 32})});
  legacy.push_back({"bert.pooler.dense.bias", at::randn({32})});
  legacy.push_back({"cls.seq_relationship.weight", at::randn({2, 32})});
  legacy.push_back({"cls.seq_relationship.bias", at::randn({2})});
  legacy.push_back({"cls.predictions.decoder.weight", theirs.at("bert.embeddings.word_embeddings.weight", "ref")});
  legacy.push_back({"bert.embeddings.position_ids", at::arange(64).unsqueeze(0)});
  test::TempDir tmp;
  save_safetensors(tmp / "model.safetensors", legacy);
  auto config = test::read_json_file(fixture("bert-tiny") + "/config.json");
  config["architectures"] = {"BertForPreTraining"};
  test::write_file(tmp / "config.json", config.dump());
  auto a = load(fixture("bert-tiny")), b = load(tmp.path());
  auto pa = a->named_parameters(), pb = b->named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (const auto& item : pa) EXPECT_TRUE(at::equal(item.value(), pb[item.key()])) << item.key();
}

TEST(BertCheckpoints, UnsupportedConfigsAreRefusedNamingTheKey) {
  auto config = test::read_json_file(fixture("bert-tiny") + "/config.json");
  auto refused = [&](const char* key, const nlohmann::json& value) {
    auto c = config;
    c[key] = value;
    return test::error_of([&] { (void)model_config_from_hf(c, "dir/config.json"); });
  };
  EXPECT_NE(refused("architectures", {"BertForQuestionAnswering"}).find("dir/config.json: \"architectures\""), std::string::npos);
  EXPECT_NE(refused("position_embedding_type", "relative_key").find("position_embedding_type"), std::string::npos);
  EXPECT_NE(refused("is_decoder", true).find("is_decoder"), std::string::npos);
  EXPECT_NE(refused("num_attention_heads", 5).find("does not divide hidden_size"), std::string::npos);
}

TEST(BertRecipes, PublishedSizesHaveTransformersParameterCounts) {
  ModelConfig base;
  base.family = "bert";
  base.n_layer = 12, base.n_head = 12, base.n_embd = 768, base.n_inner = 3072, base.block_size = 512, base.vocab_size = 30522;
  base.layer_norm_eps = 1e-12;
  base.head = "mlm";
  EXPECT_EQ(count_parameters(base), 109514298);   // BertForMaskedLM(BertConfig()), the decoder tied
  base.head = "classifier";
  base.num_labels = 2;
  EXPECT_EQ(count_parameters(base), 109483778);   // BertForSequenceClassification(BertConfig())
}

}  // namespace
