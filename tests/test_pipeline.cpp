// Pipeline parallelism end to end: `colossal train` with the blocks cut into stages on several ranks
// against one process accumulating the same micro-batches (the same global batch, in the same order):
// every schedule at 2 and 4 stages for a decoder (GPT, tied embedding) and an encoder (BERT's masked LM,
// its tied decoder), the hybrid of data, tensor and pipeline parallelism on 8 ranks, checkpoints moving
// between pipeline sizes, and the bubble and activations each schedule is known for.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <tuple>

#include "tests/support/test_support.h"
#include "tests/support/train_runs.h"

namespace fs = std::filesystem;
using colossal::test::expect_metric_close;
using colossal::test::max_relative_difference;
using colossal::test::metric_values;
using colossal::test::TempDir;
using colossal::test::train;
using colossal::test::write_recipe;

namespace {

// Micro-batches of 2 rows, 4 a step: one process accumulates them; a pipeline schedules them.
const std::string kOne = " --set train.batch_size=2 --set train.grad_accum=4 --set train.grad_clip=0.05";
const std::string kPiped = " --set train.batch_size=2 --set parallel.micro_batches=4 --set train.grad_clip=0.05";

std::string layout(int stages, const std::string& schedule, int chunks, int ranks) {
  return kPiped + " --nproc-per-node " + std::to_string(ranks) + " --set parallel.pipeline=" + std::to_string(stages) +
         " --set parallel.schedule=" + schedule + " --set parallel.virtual_stages=" + std::to_string(chunks);
}

struct Case {
  std::string name;
  int stages, chunks;
  std::string schedule;
};
const std::vector<Case> kCases = {{"gpipe2", 2, 1, "gpipe"}, {"1f1b2", 2, 1, "1f1b"}, {"inter2", 2, 2, "interleaved"},
                                  {"zb2", 2, 1, "zero_bubble"}, {"gpipe4", 4, 1, "gpipe"}, {"1f1b4", 4, 1, "1f1b"},
                                  {"inter4", 4, 2, "interleaved"}, {"zb4", 4, 1, "zero_bubble"}};

// The bubble the run measured (schedule units, stage_link.h) against theory: within 20% (zero-bubble's
// theory is a bound: at most 20% above it, and below 1F1B's).
void expect_bubble(const std::string& run, const Case& c) {
  const double p = c.stages, m = 4, v = c.chunks;
  const bool zb = c.schedule == "zero_bubble";
  const double theory = zb ? (p - 1) / (3 * m + p - 1) : (p - 1) / (v * m + p - 1);
  for (double idle : metric_values(run + "/metrics.jsonl", "pipeline_idle")) {
    if (zb) EXPECT_LE(idle, 1.2 * theory) << run;
    else EXPECT_NEAR(idle, theory, 0.2 * theory) << run;
    if (zb) EXPECT_LT(idle, (p - 1) / (m + p - 1)) << run;
  }
}

}  // namespace

TEST(PipelineTraining, EachScheduleAtTwoAndFourStagesEqualsOneProcessForGpt) {
  // Eight blocks (four stages of two, or of one with two chunks a rank), the tied embedding on the
  // first and last stage, clipping active (the norm sums over the stages, the tied copy counted once).
  TempDir dir;
  const std::string blocks = " --set model.n_layer=8 --set checkpoint.every=0 --set train.eval_every=3";
  ASSERT_EQ(train(write_recipe(dir, "one"), blocks + kOne).exit_code, 0);
  for (double n : metric_values(dir / "one/metrics.jsonl", "grad_norm")) EXPECT_GT(n, 0.05);   // clipping acted
  for (const Case& c : kCases) {
    auto r = train(write_recipe(dir, c.name), blocks + layout(c.stages, c.schedule, c.chunks, c.stages));
    ASSERT_EQ(r.exit_code, 0) << c.name << ": " << r.output;
    EXPECT_LT(max_relative_difference(dir / c.name, dir / "one"), 1e-5) << c.name;
    expect_metric_close(dir / "one", dir / c.name, "loss");
    expect_metric_close(dir / "one", dir / c.name, "grad_norm");
    expect_metric_close(dir / "one", dir / c.name, "eval_loss");
    expect_bubble(dir / c.name, c);
  }
  // Cut by parameters (the tied embedding weighs on both ends) and by measured time (the head and loss
  // weigh on the last stage): other cuts, the same training.
  for (const std::string partition : {"parameters", "profile"}) {
    auto r = train(write_recipe(dir, partition), blocks + layout(2, "1f1b", 1, 2) + " --set parallel.partition=" + partition);
    ASSERT_EQ(r.exit_code, 0) << partition << ": " << r.output;
    EXPECT_LT(max_relative_difference(dir / partition, dir / "one"), 1e-5) << partition;
  }
}

TEST(PipelineTraining, EachScheduleEqualsOneProcessForBertsMaskedLm) {
  TempDir dir;
  auto bert = [&](const std::string& name, const std::string& how) {
    return "recipes/bert-tiny.toml --set model.n_layer=8 --set train.max_steps=3 --set optim.warmup_steps=1 --set optim.decay_steps=6"
           " --set train.seq_len=32 --set train.eval_batches=2 --set train.eval_every=2 --set optim.eps=1e-5 --set output.dir=" +
           (dir / name) + " --set data.dataset=" + (dir / "data.h5") + colossal::test::pinned_kernels() + how;
  };
  ASSERT_EQ(train(bert("one", kOne), "").exit_code, 0);
  for (const Case& c : kCases) {
    auto r = train(bert(c.name, layout(c.stages, c.schedule, c.chunks, c.stages)), "");
    ASSERT_EQ(r.exit_code, 0) << c.name << ": " << r.output;
    // The attention key bias's gradient is zero but for rounding (see test_dist_e2e.cpp): left out.
    EXPECT_LT(max_relative_difference(dir / c.name, dir / "one", "key.bias"), 1e-5) << c.name;
    expect_metric_close(dir / "one", dir / c.name, "loss");
    expect_metric_close(dir / "one", dir / c.name, "eval_loss");
    expect_metric_close(dir / "one", dir / c.name, "eval_accuracy");
  }
}

TEST(PipelineTraining, OptBloomAndVitAtTwoStagesEqualOneProcess) {
  // OPT's embedding with its projections, BLOOM's embedding norm (ALiBi needs no positions on later
  // stages), ViT's patches, class token and classifier: each family's embedding and head placed.
  TempDir dir;
  auto run = [&](const std::string& recipe, const std::string& name, const std::string& how) {
    return colossal::test::run_colossal("train recipes/" + recipe + ".toml -q --set model.n_layer=4 --set train.max_steps=4"
                                        " --set optim.warmup_steps=1 --set optim.decay_steps=6 --set train.eval_batches=2"
                                        " --set train.eval_every=2 --set optim.eps=1e-5 --set output.dir=" + (dir / name) +
                                        colossal::test::pinned_kernels() + how);
  };
  for (const std::string family : {"opt-tiny", "bloom-tiny", "vit-tiny"}) {
    const std::string extra = family == "vit-tiny" ? "" : " --set train.seq_len=32 --set data.dataset=" + (dir / (family + ".h5"));
    ASSERT_EQ(run(family, family + "-one", extra + kOne).exit_code, 0) << family;
    auto r = run(family, family + "-pp", extra + layout(2, "1f1b", 1, 2));
    ASSERT_EQ(r.exit_code, 0) << family << ": " << r.output;
    // The attention key bias (OPT's k_proj) has a gradient of zero but for rounding: left out.
    const std::string key_bias = family == "opt-tiny" ? "k_proj.bias" : "key.bias";
    EXPECT_LT(max_relative_difference(dir / (family + "-pp"), dir / (family + "-one"), key_bias), 1e-5) << family;
    for (const char* metric : {"loss", "eval_loss"}) expect_metric_close(dir / (family + "-one"), dir / (family + "-pp"), metric);
  }
}

TEST(PipelineTraining, PipelineWithSequenceAndMegatronSplitsEqualsOneProcess) {
  // Stages exchange the blocks' own layout: a sequence rank's tokens, Megatron's token split inside a
  // tensor group, or a 2D grid's block of rows and features; ring attention over the stage's blocks.
  TempDir dir;
  const std::string blocks = " --set model.n_layer=4 --set checkpoint.every=0";
  ASSERT_EQ(train(write_recipe(dir, "one"), blocks + kOne).exit_code, 0);
  for (const auto& [name, how] : {std::pair<std::string, std::string>{"ring", " --set parallel.sequence=2 --set parallel.sequence_mode=ring"},
                                  {"megatron", " --set parallel.tensor=2 --set parallel.tensor_sequence=true"},
                                  {"grid", " --set parallel.tensor=4 --set parallel.tensor_mode=2d"}}) {
    const int ranks = name == "grid" ? 8 : 4;   // a 2 x 2 grid a stage
    auto r = train(write_recipe(dir, name), blocks + layout(2, "1f1b", 1, ranks) + how);
    ASSERT_EQ(r.exit_code, 0) << name << ": " << r.output;
    EXPECT_LT(max_relative_difference(dir / name, dir / "one"), 1e-5) << name;
    expect_metric_close(dir / "one", dir / name, "loss");
  }
}

TEST(PipelineTraining, DataTensorAndPipelineOnEightRanksEqualOneProcess) {
  // dp 2 x pp 2 x tp 2, ZeRO-1 over the data-parallel pairs: each data rank takes one row of each
  // micro-batch of two.
  TempDir dir;
  const std::string blocks = " --set model.n_layer=4 --set checkpoint.every=0";
  ASSERT_EQ(train(write_recipe(dir, "one"), blocks + kOne).exit_code, 0);
  auto r = train(write_recipe(dir, "hybrid"), blocks + " --set train.batch_size=1 --set parallel.micro_batches=4 --set train.grad_clip=0.05"
                                                       " --nproc-per-node 8 --set parallel.pipeline=2 --set parallel.tensor=2"
                                                       " --set parallel.data=2 --set memory.zero=1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_LT(max_relative_difference(dir / "hybrid", dir / "one"), 1e-5);
  expect_metric_close(dir / "one", dir / "hybrid", "loss");
  expect_metric_close(dir / "one", dir / "hybrid", "grad_norm");
}

TEST(PipelineTraining, CheckpointsMoveFromTwoStagesToOneProcessToFourStages) {
  // 6 steps straight in one process, against 2 steps at pp 2, resumed for 2 in one process, resumed for
  // the last 2 at pp 4: each save's files are its stages' (the tied embedding written once), each load
  // reads what its layout holds.
  TempDir dir;
  const std::string blocks = " --set model.n_layer=4 --set checkpoint.every=2 --set checkpoint.keep_last=5";
  ASSERT_EQ(train(write_recipe(dir, "one"), blocks + kOne).exit_code, 0);
  const std::string moved = write_recipe(dir, "moved");
  auto a = train(moved, blocks + layout(2, "1f1b", 1, 2) + " --set train.max_steps=2");
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const std::string ckpt = colossal::test::latest_checkpoint(dir / "moved");
  EXPECT_TRUE(fs::exists(ckpt + "/model-00001-of-00002.safetensors") && fs::exists(ckpt + "/model-00002-of-00002.safetensors")) << ckpt;
  EXPECT_FALSE(fs::exists(ckpt + "/index-of-stage-1.json"));   // merged into the index
  if (colossal::test::have_transformers()) colossal::test::expect_transformers_loads(ckpt, dir / "hf.log");
  auto b = train(moved, blocks + kOne + " --resume --set train.max_steps=4");
  ASSERT_EQ(b.exit_code, 0) << b.output;
  auto c = train(moved, blocks + layout(4, "1f1b", 1, 4) + " --resume");
  ASSERT_EQ(c.exit_code, 0) << c.output;
  EXPECT_LT(max_relative_difference(dir / "moved", dir / "one"), 1e-5);
  expect_metric_close(dir / "one", dir / "moved", "loss");
}

TEST(PipelineTraining, OneFOneBHoldsAtMostAStageCountOfMicroBatchesWhereGpipeHoldsThemAll) {
  // Eight micro-batches over two stages: rank 0 (the first stage) holds at most 2 under 1F1B, all 8
  // under GPipe; its activation peak follows.
  TempDir dir;
  const std::string common = " --set model.n_layer=4 --set checkpoint.every=0 --set train.max_steps=3 --set train.batch_size=2"
                             " --set parallel.micro_batches=8 --set parallel.pipeline=2 --nproc-per-node 2";
  for (const std::string s : {"1f1b", "gpipe"})
    ASSERT_EQ(train(write_recipe(dir, s), common + " --set parallel.schedule=" + s).exit_code, 0) << s;
  for (double held : metric_values(dir / "1f1b/metrics.jsonl", "pipeline_peak_micro_batches")) EXPECT_EQ(held, 2);
  for (double held : metric_values(dir / "gpipe/metrics.jsonl", "pipeline_peak_micro_batches")) EXPECT_EQ(held, 8);
  const auto peak_1f1b = metric_values(dir / "1f1b/metrics.jsonl", "tensor_peak_mb"), peak_gpipe = metric_values(dir / "gpipe/metrics.jsonl", "tensor_peak_mb");
  ASSERT_EQ(peak_1f1b.size(), 3u);
  EXPECT_LT(peak_1f1b.back(), 0.6 * peak_gpipe.back());
}

TEST(PipelineTraining, RecipesThePipelineCannotRunAreRefusedBeforeAnyRankStarts) {
  TempDir dir;
  const std::string recipe = write_recipe(dir, "bad");
  struct Refusal {
    std::string args, says;
  };
  for (const Refusal& f : {Refusal{"--set parallel.pipeline=4 --nproc-per-node 4", "at least 4 blocks"},
                           Refusal{"--set parallel.pipeline=2 --set parallel.schedule=interleaved --set parallel.virtual_stages=2 "
                                   "--set model.n_layer=4 --set parallel.micro_batches=3 --nproc-per-node 2", "groups of pipeline = 2"},
                           Refusal{"--set parallel.pipeline=2 --set parallel.virtual_stages=2 --nproc-per-node 2", "needs schedule = \"interleaved\""},
                           Refusal{"--set parallel.pipeline=2 --set train.grad_accum=2 --nproc-per-node 2", "micro_batches = 2 instead"},
                           Refusal{"--set parallel.pipeline=2 --set memory.zero=2 --nproc-per-node 2", "not built yet"},
                           Refusal{"--set parallel.pipeline=2 --set memory.activation_checkpoint=auto --set memory.activation_memory_gb=1 "
                                   "--nproc-per-node 2", "not built yet"}}) {
    auto r = train(recipe, f.args);
    EXPECT_NE(r.exit_code, 0) << f.args;
    EXPECT_NE(r.output.find(f.says), std::string::npos) << f.args << ": " << r.output;
  }
}
