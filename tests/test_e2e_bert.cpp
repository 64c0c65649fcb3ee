// End to end, BERT masked-LM pretraining through the same trainer as the decoders: recipes/bert-tiny
// shrunk to a few steps trains, reports the masked-token loss and accuracy, saves a BertForMaskedLM
// directory with its WordPiece files, and resumes exactly (the masks follow the sample position);
// what BERT cannot do is one error line.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "tests/support/test_support.h"

namespace fs = std::filesystem;
using namespace colossal;
using test::read_file;
using test::run_colossal;
using test::TempDir;

namespace {

// bert-tiny.toml at a test's size (one schedule whatever max_steps says), every output inside `dir/name`.
std::string train_args(const TempDir& dir, const std::string& name, int steps) {
  return "train recipes/bert-tiny.toml --set train.max_steps=" + std::to_string(steps) +
         " --set optim.warmup_steps=1 --set optim.decay_steps=6 --set train.batch_size=4 --set train.seq_len=32 --set train.eval_batches=2" +
         " --set train.eval_every=3 --set checkpoint.every=3 --set model.n_embd=32 --set model.n_inner=64" +
         " --set output.dir=" + (dir / name) + " --set data.dataset=" + (dir / "data.h5") + " -q";
}

}  // namespace

TEST(EndToEndBert, MaskedLmTrainsReportsAccuracyAndSavesABertDirectory) {
  TempDir dir;
  auto r = run_colossal(train_args(dir, "run", 6));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("eval accuracy"), std::string::npos) << r.output;
  const auto accuracy = test::metric_values(dir / "run/metrics.jsonl", "eval_accuracy");
  ASSERT_EQ(accuracy.size(), 3u);   // at the start, step 3 and the end
  for (double a : accuracy) EXPECT_TRUE(a >= 0 && a <= 1) << a;
  const auto losses = test::metric_values(dir / "run/metrics.jsonl", "eval_loss");
  EXPECT_LT(losses.back(), losses.front());   // six steps at lr 1e-3 already move a 4096-way MLM loss
  const auto summary = test::read_json_file(dir / "run/summary.json");
  EXPECT_EQ(summary["task"], "masked_lm");
  EXPECT_EQ(summary["final_eval_accuracy"], accuracy.back());

  const std::string ckpt = dir / "run/checkpoints/step-000006";
  const auto config = test::read_json_file(ckpt + "/config.json");
  EXPECT_EQ(config["architectures"][0], "BertForMaskedLM");
  EXPECT_EQ(config["model_type"], "bert");
  EXPECT_EQ(read_file(ckpt + "/vocab.txt"), read_file(test::source_dir() + "/data/kjv/bert-wordpiece-4096/vocab.txt"));
  EXPECT_EQ(test::read_json_file(ckpt + "/trainer_state.json")["eval_accuracy"], accuracy.back());
}

TEST(EndToEndBert, AResumedRunMasksAndTrainsExactlyAsAnUninterruptedOne) {
  TempDir dir;
  auto whole = run_colossal(train_args(dir, "whole", 6) + test::pinned_kernels());
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  auto first = run_colossal(train_args(dir, "split", 3) + test::pinned_kernels());
  ASSERT_EQ(first.exit_code, 0) << first.output;
  auto rest = run_colossal(train_args(dir, "split", 6) + test::pinned_kernels() + " --resume");
  ASSERT_EQ(rest.exit_code, 0) << rest.output;
  const auto a = test::metric_values(dir / "whole/metrics.jsonl", "loss");
  const auto b = test::metric_values(dir / "split/metrics.jsonl", "loss");
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 6u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "step " << i + 1;
}

TEST(EndToEndBert, WhatBertCannotDoIsOneErrorLine) {
  TempDir dir;
  auto r = run_colossal(train_args(dir, "run", 3));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  test::expect_one_line_error(run_colossal("infer " + (dir / "run") + " -p 'In the beginning' -n 4"),
                              "colossal infer (text generation) needs a causal language model");
  test::expect_one_line_error(run_colossal(train_args(dir, "cls", 3) + " --set model.head=classifier"),
                              "task \"sequence_classification\", which the trainer does not run yet");
  test::expect_one_line_error(run_colossal(train_args(dir, "bpe", 3) + " --set data.tokenizer=" + test::fixture("opt-tiny") +
                                           " --set data.dataset=" + (dir / "bpe.h5")),
                              "has no mask token; the masked_lm task needs [CLS], [SEP] and [MASK]");
}
