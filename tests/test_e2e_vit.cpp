// End to end, ViT image classification through the same trainer: recipes/vit-tiny shrunk to a few
// steps trains on Fashion-MNIST (Debian's dataset-fashion-mnist), reports test loss and accuracy,
// saves a ViTForImageClassification directory, resumes exactly, and bad data is one error line.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "tests/support/test_support.h"

using namespace colossal;
namespace fs = std::filesystem;
using test::read_file;
using test::run_colossal;
using test::TempDir;

namespace {

// vit-tiny.toml at a test's size (one schedule whatever max_steps says), every output inside `dir/name`.
std::string train_args(const TempDir& dir, const std::string& name, int steps) {
  return "train recipes/vit-tiny.toml --set train.max_steps=" + std::to_string(steps) +
         " --set optim.warmup_steps=1 --set optim.decay_steps=6 --set train.batch_size=16 --set train.eval_batches=4" +
         " --set train.eval_every=3 --set checkpoint.every=3 --set output.dir=" + (dir / name) + " -q";
}

// Fashion-MNIST is a Debian package (scripts/setup.sh installs it); a machine set up otherwise, such as
// the GPU machines scripts/dev/gpu_check.sh builds on, lacks it.
bool have_fashion_mnist() {
  const std::string dir = "/usr/share/datasets/fashion-mnist/";
  return fs::exists(dir + "train-images-idx3-ubyte") || fs::exists(dir + "train-images-idx3-ubyte.gz");
}
#define SKIP_WITHOUT_FASHION_MNIST() \
  if (!have_fashion_mnist()) GTEST_SKIP() << "no Fashion-MNIST in /usr/share/datasets (apt-get install dataset-fashion-mnist)"

}  // namespace

TEST(EndToEndVit, TrainsReportsTestAccuracyAndSavesAVitDirectory) {
  SKIP_WITHOUT_FASHION_MNIST();
  TempDir dir;
  auto r = run_colossal(train_args(dir, "run", 6));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto accuracy = test::metric_values(dir / "run/metrics.jsonl", "eval_accuracy");
  ASSERT_EQ(accuracy.size(), 3u);
  for (double a : accuracy) EXPECT_TRUE(a >= 0 && a <= 1) << a;
  const auto losses = test::metric_values(dir / "run/metrics.jsonl", "eval_loss");
  EXPECT_LT(losses.back(), losses.front());
  const auto summary = test::read_json_file(dir / "run/summary.json");
  EXPECT_EQ(summary["task"], "image_classification");
  EXPECT_EQ(summary["final_eval_accuracy"], accuracy.back());
  const auto config = test::read_json_file(dir / "run/checkpoints/step-000006/config.json");
  EXPECT_EQ(config["architectures"][0], "ViTForImageClassification");
  EXPECT_EQ(config["num_channels"], 1);
  EXPECT_EQ(config["id2label"].size(), 10u);
  test::expect_one_line_error(run_colossal("infer " + (dir / "run") + " -p 'a shirt' -n 4"),
                              "colossal infer (text generation) needs a causal language model");
}

TEST(EndToEndVit, AResumedRunShufflesAndTrainsExactlyAsAnUninterruptedOne) {
  SKIP_WITHOUT_FASHION_MNIST();
  TempDir dir;
  ASSERT_EQ(run_colossal(train_args(dir, "whole", 6) + test::pinned_kernels()).exit_code, 0);
  ASSERT_EQ(run_colossal(train_args(dir, "split", 3) + test::pinned_kernels()).exit_code, 0);
  auto rest = run_colossal(train_args(dir, "split", 6) + test::pinned_kernels() + " --resume");
  ASSERT_EQ(rest.exit_code, 0) << rest.output;
  const auto a = test::metric_values(dir / "whole/metrics.jsonl", "loss");
  const auto b = test::metric_values(dir / "split/metrics.jsonl", "loss");
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 6u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "step " << i + 1;
}

TEST(EndToEndVit, BadImageDataIsOneErrorLine) {
  SKIP_WITHOUT_FASHION_MNIST();
  TempDir dir;
  test::expect_one_line_error(run_colossal(train_args(dir, "run", 3) + " --set data.dataset=" + (dir / "none")),
                              "data.dataset: = \"" + (dir / "none") + "\" has no train-images-idx3-ubyte[.gz]");
  test::expect_one_line_error(run_colossal(train_args(dir, "run", 3) + " --set model.num_labels=5"),
                              "has labels up to 9 but the model classifies into 5 (set [model] num_labels = 10)");
  test::expect_one_line_error(run_colossal(train_args(dir, "run", 3) + " --set model.channels=2"),
                              "has 1-channel images but the model takes 2");
  test::expect_one_line_error(run_colossal(train_args(dir, "run", 3) + " --set model.patch_size=5"),
                              "patch_size: = 5 does not divide image_size = 28 into whole patches");
}
