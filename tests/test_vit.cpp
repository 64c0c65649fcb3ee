// ViT against Hugging Face transformers on the fixture of scripts/fixtures/make_vit.py (7x7 patches of
// 28x28 grey images, ten classes): the encoder output, logits, loss and every gradient within 1e-4 in
// fp32, the saved state bit for bit; the IDX reader and the image loader (rank sharding, restarts).
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <zlib.h>

#include "models/registry.h"
#include "models/vit/vit.h"
#include "src/data/idx.h"
#include "src/data/image_data.h"
#include "src/engine/checkpoint.h"
#include "tests/support/test_support.h"

using namespace colossal;
using test::fixture;

namespace {

double max_diff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

std::shared_ptr<vit::Vit> load_vit() {
  nn::LayerFactory f;
  auto m = std::dynamic_pointer_cast<vit::Vit>(load_pretrained(fixture("vit-tiny"), f));
  m->eval();
  return m;
}

TEST(Vit, EncoderOutputAndLogitsMatchTransformers) {
  auto ref = load_safetensors(fixture("vit-tiny") + "/reference.safetensors");
  auto m = load_vit();
  at::NoGradGuard no_grad;
  const auto pixels = ref.at("pixel_values", "ref");
  EXPECT_LT(max_diff(m->features(pixels), ref.at("hidden", "ref")), 1e-4);
  EXPECT_LT(max_diff(m->classify_images(pixels), ref.at("logits", "ref")), 1e-4);
}

TEST(Vit, LossAndEveryGradientMatchTransformers) {
  auto ref = load_safetensors(fixture("vit-tiny") + "/reference.safetensors");
  auto m = load_vit();
  auto loss = at::cross_entropy_loss(m->classify_images(ref.at("pixel_values", "ref")), ref.at("labels", "ref"));
  EXPECT_NEAR(loss.item<double>(), ref.at("loss", "ref").item<double>(), 1e-5);
  loss.backward();
  test::expect_hf_gradients_match(*m, ref);
}

TEST(Vit, SavedStateIsTheFixtureBitForBitAndTheCountsAgree) {
  auto m = load_vit();
  auto theirs = load_safetensors(fixture("vit-tiny") + "/model.safetensors");
  std::map<std::string, at::Tensor> ours;
  for (const auto& [n, t] : export_model_state(*m)) ours[n] = t;
  ASSERT_EQ(ours.size(), theirs.tensors.size());
  int64_t in_file = 0;
  for (const auto& [n, t] : theirs.tensors) {
    ASSERT_TRUE(ours.count(n)) << n;
    EXPECT_TRUE(at::equal(ours[n], t)) << n;
    in_file += t.numel();
  }
  EXPECT_EQ(m->parameter_count(), in_file);
  const auto config = test::read_json_file(fixture("vit-tiny") + "/config.json");
  EXPECT_EQ(count_parameters(model_config_from_hf(config, "config.json")), in_file);
  const auto written = m->hf_config();
  for (const char* key : {"architectures", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "image_size",
                          "patch_size", "num_channels", "layer_norm_eps", "hidden_act", "qkv_bias"})
    EXPECT_EQ(written[key], config[key]) << key;
  EXPECT_EQ(written["id2label"].size(), 10u);
}

TEST(Vit, PublishedShapeHasTransformersParameterCount) {
  ModelConfig base;
  base.family = "vit";
  base.n_layer = 12, base.n_head = 12, base.n_embd = 768, base.n_inner = 3072;
  base.image_size = 224, base.patch_size = 16, base.channels = 3, base.num_labels = 1000;
  base.layer_norm_eps = 1e-12;
  EXPECT_EQ(count_parameters(base), 86567656);   // ViTForImageClassification(ViTConfig(num_labels=1000))
  base.patch_size = 15;
  EXPECT_NE(test::error_of([&] { (void)count_parameters(base); }).find("patch_size = 15 does not divide image_size = 224"),
            std::string::npos);
}

std::string idx_bytes(std::vector<uint32_t> dims, const std::vector<uint8_t>& values) {
  std::string s{'\0', '\0', '\x08', static_cast<char>(dims.size())};
  for (uint32_t d : dims)
    for (int shift : {24, 16, 8, 0}) s.push_back(static_cast<char>((d >> shift) & 0xff));
  s.append(values.begin(), values.end());
  return s;
}

TEST(Idx, ReadsPlainAndGzipAndRefusesMalformedFilesNamingThem) {
  std::vector<uint8_t> values(2 * 3 * 4);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<uint8_t>(i * 7);
  const std::string bytes = idx_bytes({2, 3, 4}, values);
  test::TempDir dir;
  test::write_file(dir / "a.idx", bytes);
  gzFile gz = gzopen((dir / "a.idx.gz").c_str(), "wb");
  gzwrite(gz, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(gz);
  for (const char* name : {"a.idx", "a.idx.gz"}) {
    const auto a = read_idx(dir / name);
    EXPECT_EQ(a.dims, (std::vector<int64_t>{2, 3, 4}));
    EXPECT_EQ(a.values, values);
  }
  auto error = [](const std::string& b) { return test::error_of([&] { (void)parse_idx(b, "f.idx"); }); };
  EXPECT_EQ(error("\x01\x02"), "IDX file f.idx: is 2 bytes, shorter than the 4-byte header");
  EXPECT_EQ(error(std::string("\0\0\x0d\x01\0\0\0\x01xxxx", 12)),
            "IDX file f.idx: holds values of type 0x0d (supported: 0x08, unsigned bytes, as image data sets use)");
  EXPECT_EQ(error(idx_bytes({2, 3}, {1, 2, 3})), "IDX file f.idx: holds 3 values but its dimensions say 6");
  EXPECT_EQ(error(idx_bytes({2}, {1, 2, 3})), "IDX file f.idx: holds 3 values but its dimensions say 2");
  EXPECT_EQ(error(idx_bytes({0xffffffffu, 0xffffffffu}, {})), "IDX file f.idx: dimensions ask for more values than the file holds");
}

TEST(ImageLoader, RanksSplitTheGlobalBatchAndARestartContinuesTheStream) {
  auto set = std::make_shared<ImageSet>();
  set->images = at::arange(50, at::kByte).view({50, 1, 1, 1});
  set->labels = at::arange(50, at::kLong);
  ImageLoader one(set, 8, 5, 0, 1), r0(set, 4, 5, 0, 2), r1(set, 4, 5, 1, 2);
  std::vector<at::Tensor> seen;
  for (int step = 0; step < 12; ++step) {   // about two epochs
    auto [images, labels] = one.next();
    auto a = r0.next().second, b = r1.next().second;
    EXPECT_TRUE(at::equal(labels, at::cat({a, b}))) << "step " << step;
    EXPECT_TRUE(at::equal(images.view({-1}).to(at::kLong), labels));
    seen.push_back(labels);
  }
  // The first epoch visits each image once.
  const auto first = std::get<0>(at::sort(at::cat(seen).narrow(0, 0, 48)));
  EXPECT_EQ(std::get<0>(at::unique_consecutive(first)).numel(), 48);
  ImageLoader resumed(set, 8, 5, 0, 1, 40);
  for (int step = 5; step < 12; ++step) EXPECT_TRUE(at::equal(resumed.next().second, seen[step])) << "step " << step;
  EXPECT_NE(test::error_of([&] { ImageLoader(set, 32, 5, 0, 2); }).find("fewer than one global batch of 64"), std::string::npos);
}

}  // namespace
