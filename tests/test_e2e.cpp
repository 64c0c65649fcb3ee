// End to end: the colossal binary as a user runs it. Trains the tiny recipe on the embedded corpus
// and checks that held-out loss falls well below where it started, that infer is deterministic for
// a seed, and that bad input ends in one "error:" line and a non-zero exit.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <csignal>
#include <sys/wait.h>
#include <unistd.h>

#include "src/core/text.h"
#include "src/io/safetensors.h"
#include "tests/support/test_support.h"

namespace fs = std::filesystem;
using colossal::test::read_file;
using colossal::test::run_colossal;
using colossal::test::TempDir;
using colossal::test::write_file;
using colossal::test::expect_one_line_error;

namespace {

// Overrides that keep every output of a run inside `dir`.
// `colossal train` on `recipe` (its output under dir/run) as a child process writing to dir/out.txt,
// returned once the run's first checkpoint is written (up to 2 minutes). `pid` is -1 when the fork
// failed; `latest` exists unless the checkpoint never came.
struct BackgroundRun {
  pid_t pid = -1;
  std::string recipe, log;
  fs::path latest;
};
BackgroundRun train_until_first_checkpoint(const TempDir& dir, const colossal::Recipe& recipe) {
  BackgroundRun run{-1, dir / "r.toml", dir / "out.txt", fs::path(dir / "run") / "checkpoints" / "latest"};
  write_file(run.recipe, recipe.to_toml());
  const std::string binary = colossal::test::binary_path();
  run.pid = fork();   // the child only calls async-signal-safe functions until exec
  if (run.pid == 0) {
    if (!freopen(run.log.c_str(), "w", stderr) || !freopen(run.log.c_str(), "a", stdout)) _exit(126);
    execl(binary.c_str(), "colossal", "train", run.recipe.c_str(), "--quiet", static_cast<char*>(nullptr));
    _exit(127);
  }
  for (int i = 0; run.pid > 0 && i < 1200 && !fs::exists(run.latest); ++i) usleep(100000);
  return run;
}

std::string into(const TempDir& dir) {
  return " --set output.dir=" + (dir / "run") + " --set data.tokenizer=" + (dir / "tok.model") +
         " --set data.dataset=" + (dir / "data.h5");
}

}  // namespace

TEST(EndToEnd, TinyRecipeLearnsAndInferIsDeterministicForASeed) {
  TempDir dir;
  auto train = run_colossal("train recipes/gpt-tiny.toml" + into(dir));
  ASSERT_EQ(train.exit_code, 0) << train.output;
  auto evals = colossal::test::metric_values(dir / "run/metrics.jsonl", "eval_loss");
  ASSERT_GE(evals.size(), 2u);
  EXPECT_LT(evals.back(), 0.7 * evals.front()) << "eval loss " << evals.front() << " -> " << evals.back();
  EXPECT_NE(train.output.find("done: 300 steps"), std::string::npos) << train.output;

  const std::string ckpt = dir / "run";
  auto a = run_colossal("infer " + ckpt + " -p 'And God said' -n 40 --seed 5 --top-k 20 -q");
  auto b = run_colossal("infer " + ckpt + " -p 'And God said' -n 40 --seed 5 --top-k 20 -q");
  auto c = run_colossal("infer " + ckpt + " -p 'And God said' -n 40 --seed 6 --top-k 20 -q");
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_EQ(a.output, b.output);
  EXPECT_NE(a.output, c.output);
  EXPECT_EQ(a.output.rfind("And God said", 0), 0u) << a.output;
  EXPECT_GT(a.output.size(), 60u);

  // A batch from a file gives each prompt what it gets alone (greedy, so sampling order is moot).
  write_file(dir / "prompts.txt", "In the beginning\nThe LORD is my shepherd;\n");
  auto batch = run_colossal("infer " + ckpt + " --prompts " + (dir / "prompts.txt") + " -n 20 --greedy --jsonl -q");
  auto alone = run_colossal("infer " + ckpt + " -p 'The LORD is my shepherd;' -n 20 --greedy --jsonl -q");
  ASSERT_EQ(batch.exit_code, 0) << batch.output;
  auto second = batch.output.substr(batch.output.find('\n') + 1);
  EXPECT_EQ(nlohmann::json::parse(second)["completion"], nlohmann::json::parse(alone.output)["completion"]);
  // Each block's weights read from the disk as it runs (a model larger than memory): the same tokens,
  // with two blocks' weights in memory at most (the running one and the one being read). Our GPT-2
  // checkpoint holds every block tensor as the model computes with it (the Conv1D weights transposed),
  // so the blocks are read in place from model.safetensors (mapped, this small model being read through
  // the page cache; with O_DIRECT, into buffers); through the cache, the same tokens again.
  const std::string streaming = "infer " + ckpt + " --prompts " + (dir / "prompts.txt") + " -n 20 --greedy --jsonl -q --stream-weights --stream-cache " + dir.path();
  for (const char* source : {"", " --stream-source checkpoint --stream-io direct", " --stream-source cache", " --stream-source cache --stream-io direct"}) {
    auto streamed = run_colossal(streaming + source);
    ASSERT_EQ(streamed.exit_code, 0) << source << "\n" << streamed.output;
    EXPECT_EQ(streamed.output, batch.output) << source;
  }
  // The weights read onto huge pages (memory/huge_pages.h; serve's default, infer's on asking) decode
  // as they do where LibTorch allocates them.
  setenv("COLOSSAL_HUGE_PAGES", "1", 1);
  auto huge_pages = run_colossal("infer " + ckpt + " --prompts " + (dir / "prompts.txt") + " -n 20 --greedy --jsonl -q");
  auto placed = run_colossal("infer " + ckpt + " -p 'In the beginning' -n 5 --greedy");
  setenv("COLOSSAL_HUGE_PAGES", "2", 1);
  expect_one_line_error(run_colossal("infer " + ckpt + " -p hi -q"), "COLOSSAL_HUGE_PAGES=\"2\" is not a choice (valid: 1");
  unsetenv("COLOSSAL_HUGE_PAGES");
  ASSERT_EQ(huge_pages.exit_code, 0) << huge_pages.output;
  EXPECT_EQ(huge_pages.output, batch.output);
  ASSERT_EQ(placed.exit_code, 0) << placed.output;
  EXPECT_NE(placed.output.find("in one allocation advised for huge pages (transparent_hugepage: "), std::string::npos) << placed.output;
  auto logged = run_colossal("infer " + ckpt + " -p 'In the beginning' -n 5 --greedy --stream-weights");
  ASSERT_EQ(logged.exit_code, 0) << logged.output;
  EXPECT_NE(logged.output.find("at most 2 blocks in memory"), std::string::npos) << logged.output;
  EXPECT_NE(logged.output.find("in place from the checkpoint's files (mapped"), std::string::npos) << logged.output;
  auto cached = run_colossal("infer " + ckpt + " -p 'In the beginning' -n 5 --greedy --stream-weights --stream-source cache --stream-cache " + dir.path());
  ASSERT_EQ(cached.exit_code, 0) << cached.output;
  EXPECT_NE(cached.output.find("cache in " + dir.path()), std::string::npos) << cached.output;
  {
    // The same checkpoint sharded as save_pretrained shards a large model (cut between tensors, so a
    // block straddles two files): each block is read in place from both, the same tokens again.
    const std::string sharded = dir / "sharded";
    std::string step = read_file(ckpt + "/checkpoints/latest");
    step.erase(step.find_last_not_of(" \n") + 1);
    const std::filesystem::path saved = std::filesystem::path(ckpt) / "checkpoints" / step;
    std::filesystem::create_directories(sharded);
    for (const char* f : {"config.json", "tokenizer.model"}) std::filesystem::copy_file(saved / f, std::filesystem::path(sharded) / f);
    const auto whole = colossal::load_safetensors((saved / "model.safetensors").string());
    auto first_of = [&](const std::string& prefix) {
      size_t i = 0;
      while (i < whole.tensors.size() && whole.tensors[i].name.rfind(prefix, 0) != 0) ++i;
      return i;
    };
    // Cuts inside block 0 and inside block 1.
    const size_t n = whole.tensors.size(), cuts[] = {0, first_of("transformer.h.0.") + 3, first_of("transformer.h.1.") + 5, n};
    ASSERT_LT(cuts[2], n);
    nlohmann::json index = {{"metadata", nlohmann::json::object()}, {"weight_map", nlohmann::json::object()}};
    for (int i = 0; i < 3; ++i) {
      const std::string file = "model-0000" + std::to_string(i + 1) + "-of-00003.safetensors";
      std::vector<colossal::NamedTensor> part(whole.tensors.begin() + static_cast<long>(cuts[i]), whole.tensors.begin() + static_cast<long>(cuts[i + 1]));
      for (const auto& t : part) index["weight_map"][t.name] = file;
      colossal::save_safetensors(sharded + "/" + file, part);
    }
    write_file(sharded + "/model.safetensors.index.json", index.dump());
    for (const char* io : {"direct", "page-cache"}) {
      auto in_shards = run_colossal("infer " + sharded + " --prompts " + (dir / "prompts.txt") +
                                    " -n 20 --greedy --jsonl -q --stream-weights --stream-source checkpoint --stream-io " + io);
      ASSERT_EQ(in_shards.exit_code, 0) << io << "\n" << in_shards.output;
      EXPECT_EQ(in_shards.output, batch.output) << io;
    }
  }

  // A stop string ends the completion before it.
  auto stopped = run_colossal("infer " + ckpt + " -p 'And' -n 60 --greedy --stop ' the' --jsonl -q");
  auto j = nlohmann::json::parse(stopped.output);
  EXPECT_EQ(j["finish_reason"], "stop");
  EXPECT_EQ(j["completion"].get<std::string>().find(" the"), std::string::npos);

  // Prompt longer than the context (block_size 128).
  std::string long_prompt;
  for (int i = 0; i < 200; ++i) long_prompt += "and the LORD ";
  expect_one_line_error(run_colossal("infer " + ckpt + " -p '" + long_prompt + "' -q"), "tokens but the model's context is 128");

  // A temperature as small as the range allows samples like greedy instead of failing on inf/inf.
  auto cold = run_colossal("infer " + ckpt + " -p 'And God said' -n 20 -t 1e-45 --seed 3 -q");
  auto greedy = run_colossal("infer " + ckpt + " -p 'And God said' -n 20 --greedy -q");
  ASSERT_EQ(cold.exit_code, 0) << cold.output;
  EXPECT_EQ(cold.output, greedy.output);
  // Prompts must be UTF-8 in every mode (JSON could not carry them; text mode used to accept them).
  write_file(dir / "bad_prompts.txt", "In the beginning\n\xff\xfe oops\n");
  for (const char* mode : {"", " --jsonl"})
    expect_one_line_error(run_colossal("infer " + ckpt + " --prompts " + (dir / "bad_prompts.txt") + " -n 3 -q" + mode),
                          "prompt 2 of " + (dir / "bad_prompts.txt") + " is not valid UTF-8 (byte 0)");

  // A config.json that asks for more memory than the machine has is refused before allocating.
  const std::string config_path = dir / ("run/checkpoints/" + read_file(dir / "run/checkpoints/latest").substr(0, 11) + "/config.json");
  const std::string config = read_file(config_path);
  auto huge = nlohmann::json::parse(config);
  huge["n_layer"] = 1024, huge["n_embd"] = 65536, huge["n_head"] = 1, huge["n_inner"] = nullptr;
  write_file(config_path, huge.dump());
  expect_one_line_error(run_colossal("infer " + ckpt + " -p hi -q"), "(fp32 weights; --stream-weights reads them block by block instead) needs about");
  write_file(config_path, config);

  // A damaged checkpoint: truncated weights.
  const std::string latest = dir / ("run/checkpoints/" + read_file(dir / "run/checkpoints/latest").substr(0, 11));
  std::string bytes = read_file(latest + "/model.safetensors");
  write_file(latest + "/model.safetensors", bytes.substr(0, 1000));
  expect_one_line_error(run_colossal("infer " + ckpt + " -p hi -q"), "model.safetensors: ");
  write_file(latest + "/model.safetensors", bytes.substr(0, 4));
  expect_one_line_error(run_colossal("infer " + ckpt + " -p hi -q"), "too short for a safetensors header");
}

// The kernel choices one infer timed are the next one's (src/engine/kernel_cache.h): it times nothing
// and generates the same text.
TEST(EndToEnd, ASecondInferStartsWithTheKernelChoicesTheFirstTimed) {
  TempDir dir;
  auto train = run_colossal("train recipes/gpt-tiny.toml --set train.max_steps=2 --set optim.warmup_steps=1 --set train.eval_every=0 -q" + into(dir));
  ASSERT_EQ(train.exit_code, 0) << train.output;
  const std::string cache = dir / "cache/kernel-choices.json";
  setenv("COLOSSAL_KERNEL_CACHE", cache.c_str(), 1);
  const std::string infer = "infer " + (dir / "run") + " -p 'And God said' -n 6 --greedy --jsonl";
  auto first = run_colossal(infer);
  auto second = run_colossal(infer);
  setenv("COLOSSAL_KERNEL_CACHE", "off", 1);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  ASSERT_EQ(second.exit_code, 0) << second.output;
  // The first timed its shapes (the prefill's GEMM among them, which only a cached run times) and saved them.
  EXPECT_NE(first.output.find(" ms, ATen "), std::string::npos) << first.output;
  EXPECT_NE(first.output.find("kernels: gemm [fwd rows="), std::string::npos) << first.output;
  ASSERT_TRUE(std::filesystem::exists(cache));
  const auto saved = nlohmann::json::parse(read_file(cache))["entries"];
  ASSERT_EQ(saved.size(), 1u) << saved.dump();
  const size_t n = saved.begin().value()["choices"].size();
  EXPECT_GE(n, 3u) << saved.dump();
  EXPECT_EQ(second.output.find(" ms, ATen "), std::string::npos) << second.output;
  EXPECT_NE(second.output.find("kernels: " + std::to_string(n) + " choices timed by an earlier run on this machine, from " + cache),
            std::string::npos) << second.output;
  auto record = [](const std::string& out) {   // the --jsonl line among the log's
    const size_t at = out.find("{\"");
    return at == std::string::npos ? std::string() : out.substr(at, out.find('\n', at) - at);
  };
  EXPECT_NE(record(first.output).find("\"completion\""), std::string::npos) << first.output;
  EXPECT_EQ(record(second.output), record(first.output));
}

// Training keeps its timed choices too: a second run on the machine times nothing, says where its
// choices came from, and computes with the same kernels, so its losses are the first run's bits.
TEST(EndToEnd, ASecondTrainStartsWithTheKernelChoicesTheFirstTimedAndTrainsTheSameBits) {
  TempDir dir;
  const std::string cache = dir / "cache/kernel-choices.json";
  setenv("COLOSSAL_KERNEL_CACHE", cache.c_str(), 1);
  auto train = [&](const std::string& name) {
    return run_colossal("train recipes/gpt-tiny.toml --set train.max_steps=2 --set optim.warmup_steps=1 --set train.eval_every=0"
                        " --set checkpoint.every=0 --set checkpoint.at_end=false" + into(dir) + " --set output.dir=" + (dir / name));
  };
  auto first = train("first");
  auto second = train("second");
  setenv("COLOSSAL_KERNEL_CACHE", "off", 1);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_NE(first.output.find("kernels: gemm [dw+ rows="), std::string::npos) << first.output;
  ASSERT_TRUE(std::filesystem::exists(cache));
  const auto saved = nlohmann::json::parse(read_file(cache))["entries"];
  ASSERT_EQ(saved.size(), 1u) << saved.dump();
  const auto& choices = saved.begin().value()["choices"];
  // every form of a dense layer's GEMM, and the fused kernels', from the first step
  for (const std::string kernel : {"gemm fwd ", "gemm dx ", "gemm dw+ ", "attention ", "layer_norm ", "gelu "}) {
    bool found = false;
    for (const auto& [key, value] : choices.items()) found = found || key.rfind(kernel, 0) == 0;
    EXPECT_TRUE(found) << kernel << " in " << choices.dump();
  }
  EXPECT_EQ(second.output.find(" ms, ATen "), std::string::npos) << second.output;
  EXPECT_NE(second.output.find("kernels: " + std::to_string(choices.size()) + " choices timed by an earlier run on this machine"),
            std::string::npos) << second.output;
  const auto loss_first = colossal::test::metric_values(dir / "first/metrics.jsonl", "loss");
  ASSERT_EQ(loss_first.size(), 2u);
  EXPECT_EQ(colossal::test::metric_values(dir / "second/metrics.jsonl", "loss"), loss_first);
}

TEST(EndToEnd, DryRunPrintsResolvedRecipeParametersAndMemory) {
  auto r = run_colossal("train recipes/gpt2-124m.toml --dry-run --set train.batch_size=2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("batch_size = 2"), std::string::npos);
  EXPECT_NE(r.output.find("124.5M parameters (124475904)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("memory per rank (fp32, adamw, ZeRO stage 0 over 1 data-parallel rank(s))"), std::string::npos) << r.output;
  // Under ZeRO-2 over 4 ranks each holds a quarter of the gradients and of the two AdamW moments.
  r = run_colossal("train recipes/gpt2-124m.toml --dry-run --set train.batch_size=2 --set memory.zero=2 --nproc-per-node 4");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const double p = 124475904;
  EXPECT_NE(r.output.find("ZeRO stage 2 over 4 data-parallel rank(s)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("  weights     " + colossal::human_bytes(4 * p) + "\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("  gradients   " + colossal::human_bytes(4 * p / 4) + "\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("  optimizer   " + colossal::human_bytes(8 * p / 4) + "\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("for its 4 ranks"), std::string::npos) << r.output;
}

TEST(EndToEnd, BadInputEndsInOneErrorLine) {
  TempDir dir;
  write_file(dir / "typo.toml", "[train]\nbatch_size = 4\nmax_step = 10\n");
  expect_one_line_error(run_colossal("train " + (dir / "typo.toml")), "typo.toml:3: unknown key \"max_step\" in [train] (did you mean \"max_steps\"?)");
  expect_one_line_error(run_colossal("train recipes/gpt-tiny.toml --set model.n_head=3"), "n_head: = 3 does not divide n_embd = 128");
  expect_one_line_error(run_colossal("train recipes/nope.toml"), "recipe recipes/nope.toml: no such file");
  expect_one_line_error(run_colossal("infer " + (dir / "missing") + " -p hi"), "no such file or directory");
  expect_one_line_error(run_colossal("infer " + dir.path() + " -p hi"), "not a checkpoint");

  write_file(dir / "empty.txt", "\n\n");
  expect_one_line_error(run_colossal("train recipes/gpt-tiny.toml --set data.text=" + (dir / "empty.txt") + into(dir)),
                        "empty corpus");
  expect_one_line_error(run_colossal("data prepare --text " + (dir / "empty.txt") + " --tokenizer x --out y"), "tokenizer x: no such file");
  expect_one_line_error(run_colossal("train recipes/gpt-tiny.toml --resume" + into(dir)), "no such file or directory");

  // Flags: NaN passes a plain range check, and "-1" wraps into an unsigned seed, so both are checked as text.
  const std::string infer = "infer " + (dir / "none") + " -p hi ";
  expect_one_line_error(run_colossal(infer + "--top-p nan"), "--top-p: 'nan' is not a number in [0, 1]");
  expect_one_line_error(run_colossal(infer + "--temperature nan"), "'nan' is not a number in [0, 100]");
  expect_one_line_error(run_colossal(infer + "--temperature 1e309"), "'1e309' is not a number in [0, 100]");
  expect_one_line_error(run_colossal(infer + "--seed -1"), "--seed: '-1' is not a whole number in [0, 18446744073709551615]");
  expect_one_line_error(run_colossal(infer + "--seed 18446744073709551616"), "is not a whole number in [0, 18446744073709551615]");
  expect_one_line_error(run_colossal(infer + "--top-k 99999999999999999999"), "--top-k: '99999999999999999999' is not a whole number");
  expect_one_line_error(run_colossal("data prepare --text a --tokenizer b --out c --val-fraction nan"),
                        "--val-fraction: 'nan' is not a number in [0, 0.5]");
  // A recipe that cannot train fails its dry run: no [model] (outside finetune), or no data to build from.
  write_file(dir / "nomodel.toml", "[data]\ntext = \"data/kjv/kjv.txt\"\n");
  expect_one_line_error(run_colossal("train " + (dir / "nomodel.toml") + " --dry-run"), "nomodel.toml: has no [model] section");
  write_file(dir / "nodata.toml", "[model]\nn_layer = 2\n");
  expect_one_line_error(run_colossal("train " + (dir / "nodata.toml") + " --dry-run"), "[data] tokenizer: is required");
  expect_one_line_error(run_colossal("train recipes/gpt-tiny.toml --dry-run --set data.text=" + (dir / "none.txt") +
                                     " --set data.tokenizer=" + (dir / "none.model") + " --set data.dataset=" + (dir / "none.h5")),
                        "file " + (dir / "none.txt") + " does not exist");
  expect_one_line_error(run_colossal("train " + dir.path()), "is a directory, not a TOML file");
  write_file(dir / "a_file", "x");
  expect_one_line_error(run_colossal("train recipes/gpt-tiny.toml" + into(dir) + " --set output.dir=" + (dir / "a_file")),
                        "--set output.dir: " + (dir / "a_file") + " is a file, not a directory");
  expect_one_line_error(run_colossal("train recipes/gpt-tiny.toml" + into(dir) + " --set checkpoint.dir=" + (dir / "a_file/ck")),
                        "--set checkpoint.dir: cannot create directory " + (dir / "a_file/ck") + " (" + (dir / "a_file") + " is a file)");
  // A model too large for this machine is refused before anything is allocated.
  expect_one_line_error(run_colossal("train recipes/gpt-tiny.toml --set model.n_embd=1048576 --set model.n_head=1" + into(dir)),
                        "-parameter model (weights, gradients and adamw state at ZeRO stage 0, and one micro-batch's activations) needs about");
  auto dry = run_colossal("train recipes/gpt-tiny.toml --dry-run --set model.n_embd=1048576 --set model.n_head=1");
  EXPECT_EQ(dry.exit_code, 0) << dry.output;
  EXPECT_NE(dry.output.find("does not fit: training would stop here"), std::string::npos) << dry.output;
}

TEST(EndToEnd, OptimizerOffloadToNvmeIsPlannedPerTierAndABadPathIsRefusedBeforeTraining) {
  TempDir dir;
  const std::string nvme = dir / "nvme";
  std::filesystem::create_directory(nvme);
  const std::string offload = " --set memory.offload_optimizer=nvme --set memory.nvme_path=";
  auto r = run_colossal("train recipes/gpt2-124m.toml --dry-run --set train.batch_size=2" + offload + nvme);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const double p = 124475904;   // AdamW's two moments go to the disk
  EXPECT_NE(r.output.find("  nvme        " + colossal::human_bytes(8 * p) + " optimizer states in " + nvme + " ("), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(" free: fits)"), std::string::npos) << r.output;
  // In memory: three staged slices of 4M elements, each with both moments.
  EXPECT_NE(r.output.find("  optimizer   " + colossal::human_bytes(3.0 * 4194304 * 2 * 4) + "\n"), std::string::npos) << r.output;

  expect_one_line_error(run_colossal("train recipes/gpt-tiny.toml --set memory.offload_optimizer=nvme" + into(dir)),
                        "offload_optimizer: = \"nvme\" needs nvme_path, a directory on a local disk");
  expect_one_line_error(run_colossal("train recipes/gpt-tiny.toml --set memory.offload_optimizer=disk" + into(dir)), "offload_optimizer");
  // Parameters on NVMe: the model's block parameters leave memory, their fp32 master joins the file.
  r = run_colossal("train recipes/gpt2-124m.toml --dry-run --set train.batch_size=2 --set memory.zero=3 --set memory.offload_params=nvme" +
                   offload + nvme);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("  nvme        " + colossal::human_bytes(12 * p) + " optimizer states and parameters (fp32 master) in " + nvme),
            std::string::npos) << r.output;
  expect_one_line_error(run_colossal("train recipes/gpt-tiny.toml --set memory.offload_params=nvme" + offload + nvme + into(dir)),
                        "offload_params: = \"nvme\" needs zero = 3: a block's parameters are brought in as it runs");
  expect_one_line_error(run_colossal("train recipes/gpt-tiny.toml --set memory.zero=3 --set memory.offload_params=nvme" + into(dir)),
                        "offload_params: = \"nvme\" keeps the parameters in the optimizer states' file, as their master copy: set "
                        "offload_optimizer = \"nvme\" too");
  // The update beside the next forward: ZeRO-3 only, and not while the forward reads the file it writes.
  expect_one_line_error(run_colossal("train recipes/gpt-tiny.toml --set memory.overlap_update=on" + into(dir)),
                        "overlap_update: = \"on\" needs zero = 3: the next forward waits for each chunk's update as its block gathers it");
  expect_one_line_error(run_colossal("train recipes/gpt-tiny.toml --set memory.zero=3 --set memory.overlap_update=on --set memory.offload_params=nvme" +
                                     offload + nvme + into(dir)),
                        "overlap_update = \"on\": with offload_params = \"nvme\" the forward reads the parameters from the file the update writes");
  const std::string missing = dir / "missing";
  expect_one_line_error(run_colossal("train recipes/gpt-tiny.toml --dry-run" + offload + missing),
                        "nvme_path " + missing + ": " + missing + " does not exist");
  expect_one_line_error(run_colossal("train recipes/gpt-tiny.toml" + offload + missing + into(dir)),
                        "nvme_path " + missing + " (optimizer states): " + missing + " does not exist");
  expect_one_line_error(run_colossal("train recipes/gpt-tiny.toml --set optim.name=sgd --set optim.momentum=0" + offload + nvme + into(dir)),
                        "sgd as configured keeps no optimizer state to offload");
  EXPECT_FALSE(std::filesystem::exists(dir / "run/checkpoints/latest"));   // refused before training
}

TEST(EndToEnd, GeminiPlacementIsCheckedBeforeTrainingAndAMeteredRunStaysWithinItsDeviceBudget) {
  TempDir dir;
  expect_one_line_error(run_colossal("train recipes/gpt-tiny.toml --set memory.placement=cpu" + into(dir)),
                        "placement: = \"cpu\" needs zero = 3: chunks are brought to the device block by block");
  expect_one_line_error(run_colossal("train recipes/gpt-tiny.toml --set memory.device_memory_limit_gb=1" + into(dir)),
                        "device_memory_limit_gb: needs zero = 3");
  expect_one_line_error(run_colossal("train recipes/gpt-tiny.toml --set memory.placement=gpu" + into(dir)), "placement");
  expect_one_line_error(run_colossal("train recipes/gpt-tiny.toml --set memory.zero=2 --set memory.offload_params=cpu" + into(dir)),
                        "offload_params: = \"cpu\" needs zero = 3");
  // Less than the embeddings, two blocks and one micro-batch's activations: refused before training.
  const std::string zero3 = " --set memory.zero=3 --set train.max_steps=4 --set optim.warmup_steps=1 --set train.eval_every=0 --set checkpoint.every=0 --set train.batch_size=4";
  expect_one_line_error(run_colossal("train recipes/gpt-tiny.toml --set memory.device_memory_limit_gb=0.001" + zero3 + into(dir)),
                        "device_memory_limit_gb: = 0.001 (1.02 MiB) is too small for even one block: the device needs at least ");
  EXPECT_FALSE(fs::exists(dir / "run/checkpoints/latest"));
  // The host's cap: gpt-tiny's chunks keep about 8 MiB of shards and optimizer states there under cpu.
  expect_one_line_error(run_colossal("train recipes/gpt-tiny.toml --set memory.placement=cpu --set memory.host_memory_limit_gb=0.001" + zero3 +
                                     into(dir)),
                        "host_memory_limit_gb: the chunks keep ");
  auto r = run_colossal("train recipes/gpt-tiny.toml --dry-run --set memory.device_memory_limit_gb=0.25" + zero3);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("  device      at least "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(" of the budget of 256.00 MiB (placement auto: fits)"), std::string::npos) << r.output;
  // Placement auto in a budget of 64 MiB: every step's largest window is reported and within it.
  r = run_colossal("train recipes/gpt-tiny.toml --set memory.device_memory_limit_gb=0.0625" + zero3 + into(dir));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(read_file(dir / "run/train.log").find("placement auto within a device budget of 64.00 MiB"), std::string::npos);
  const auto peaks = colossal::test::metric_values(dir / "run/metrics.jsonl", "device_peak_mb");
  ASSERT_EQ(peaks.size(), 4u);
  for (double mb : peaks) {
    EXPECT_GT(mb, 0);
    EXPECT_LE(mb, 64);
  }
}

TEST(EndToEnd, ActivationCheckpointingTrainsBitIdenticallyInLessTensorMemory) {
  // With dropout on: each recomputed block replays the generator, so losses and gradient norms are the
  // same to the bit; recomputing every block holds less at the step's peak than keeping every
  // activation, and recomputing every other block holds an amount in between. The kernels are fixed:
  // where ours and ATen's time alike (the GEMM's dx and dW on a Zen 3), the first-use timing of each run
  // may pick either, and the runs would differ by that, not by the recomputation.
  TempDir dir;
  const std::string common = " --set model.dropout=0.1 --set train.max_steps=3 --set optim.warmup_steps=1 --set train.eval_every=0"
                             " --set checkpoint.every=0 --set checkpoint.at_end=false --set train.batch_size=8 --set kernels.gemm=fused"
                             " --set kernels.layer_norm=fused --set kernels.gelu=fused --set kernels.attention=fused" + into(dir);
  std::map<std::string, std::vector<double>> loss, norm, peak;
  for (const std::string run : {"none", "full", "every_n", "full zero3"}) {
    // under ZeRO-3 the chain gathers a block again for its rerun
    const std::string ac = run.substr(0, run.find(' ')), zero = run == "full zero3" ? " --set memory.zero=3 --set memory.chunk_size_mb=0.05" : "";
    const std::string out = dir / ("run-" + std::to_string(loss.size()));
    auto r = run_colossal("train recipes/gpt-tiny.toml -q --set memory.activation_checkpoint=" + ac + zero + common + " --set output.dir=" + out);
    ASSERT_EQ(r.exit_code, 0) << run << ": " << r.output;
    loss[run] = colossal::test::metric_values(out + "/metrics.jsonl", "loss");
    norm[run] = colossal::test::metric_values(out + "/metrics.jsonl", "grad_norm");
    peak[run] = colossal::test::metric_values(out + "/metrics.jsonl", "tensor_peak_mb");
    ASSERT_EQ(peak[run].size(), 3u) << run;
  }
  for (const std::string run : {"full", "every_n", "full zero3"}) {
    EXPECT_EQ(loss[run], loss["none"]) << run;
    if (run != "full zero3") EXPECT_EQ(norm[run], norm["none"]) << run;   // ZeRO-3 sums the norm by chunks
  }
  EXPECT_LT(peak["full"].back(), peak["every_n"].back());
  EXPECT_LT(peak["every_n"].back(), peak["none"].back());
  expect_one_line_error(run_colossal("train recipes/gpt-tiny.toml --set memory.activation_checkpoint=some" + into(dir)),
                        "activation_checkpoint");
}

TEST(EndToEnd, AKilledOffloadedRunLeavesNoFileBehindAndResumesFromItsLastCheckpoint) {
  TempDir dir;
  const std::string nvme = dir / "nvme";
  fs::create_directory(nvme);
  auto recipe = colossal::test::tiny_training_recipe(dir / "run", 100000,
                                                     {"checkpoint.every=2", "train.eval_every=0", "memory.offload_optimizer=nvme",
                                                      "memory.nvme_path=" + nvme, "memory.chunk_size_mb=0.01"});
  const auto run = train_until_first_checkpoint(dir, recipe);
  const pid_t pid = run.pid;
  const std::string &log = run.log, &recipe_path = run.recipe;
  const fs::path& latest = run.latest;
  ASSERT_GE(pid, 0);
  ASSERT_TRUE(fs::exists(latest)) << read_file(log);
  kill(pid, SIGKILL);   // mid-step, with the offload file open and transfers in flight
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(fs::is_empty(nvme));   // the file had no name: nothing for the next run to clean
  std::string name = read_file(latest.string());
  name.erase(name.find_last_not_of("\n") + 1);
  const int64_t step = std::stoll(name.substr(name.find('-') + 1));
  auto r = run_colossal("train " + recipe_path + " --resume --set train.max_steps=" + std::to_string(step + 2) + " -q");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto losses = colossal::test::metric_values(dir / "run/metrics.jsonl", "loss");
  ASSERT_FALSE(losses.empty());
  EXPECT_TRUE(std::isfinite(losses.back()));
  EXPECT_TRUE(fs::is_empty(nvme));
}

TEST(EndToEnd, ADiskThatFillsMidRunEndsItWithAMessageAndTheLastCheckpointIntact) {
  TempDir dir;
  // Checkpoints on a small tmpfs: the first one fits, the second one (written beside it before the old
  // one goes) does not.
  const std::string disk = dir / "disk";
  fs::create_directory(disk);
  auto recipe = colossal::test::tiny_training_recipe(dir / "run", 6, {"checkpoint.every=2", "train.eval_every=0",
                                                                        "checkpoint.dir=" + disk});
  const std::string recipe_path = dir / "r.toml";
  write_file(recipe_path, recipe.to_toml());
  // How large one checkpoint is, from a run with room.
  auto r = run_colossal("train " + recipe_path + " -q --set train.max_steps=2 --set checkpoint.dir=" + (dir / "roomy"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  uintmax_t one = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir / "roomy"))
    if (e.is_regular_file()) one += e.file_size();
  const uintmax_t size = one + one / 2 + 64 * 1024;
  if (std::system(("mount -t tmpfs -o size=" + std::to_string(size) + " tmpfs " + disk + " 2>/dev/null").c_str()) != 0)
    GTEST_SKIP() << "cannot mount a tmpfs here (needs root): the full disk is made with one";
  r = run_colossal("train " + recipe_path + " -q");
  std::system(("cp -r " + disk + "/. " + (dir / "kept") + " && umount " + disk).c_str());
  EXPECT_NE(r.exit_code, 0) << r.output;
  expect_one_line_error(r, "No space left on device");
  // The last complete checkpoint is the first one, and a run resumes from it.
  ASSERT_TRUE(fs::exists(dir / "kept/latest")) << r.output;
  std::string latest = read_file(dir / "kept/latest");
  latest.erase(latest.find_last_not_of("\n") + 1);
  EXPECT_EQ(latest, "step-000002");
  for (const auto& e : fs::directory_iterator(dir / "kept"))
    EXPECT_EQ(e.path().filename().string().rfind(".tmp", 0), std::string::npos) << "a half-written checkpoint was left: " << e.path();
  r = run_colossal("train " + recipe_path + " -q --resume --set checkpoint.dir=" + (dir / "kept") + " --set train.max_steps=3");
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

TEST(EndToEnd, DataCommandsBuildATokenizerAndDataset) {
  TempDir dir;
  auto docs = read_file(colossal::test::source_dir() + "/data/kjv/kjv.txt").substr(0, 300000);
  write_file(dir / "text.txt", docs);
  // Outputs that cannot be written fail up front, naming the flag, and leave no temporary files.
  fs::create_directories(dir / "adir");
  expect_one_line_error(run_colossal("data tokenizer --text " + (dir / "text.txt") + " --vocab 600 --out " + (dir / "adir")),
                        "--out: " + (dir / "adir") + " is a directory (give the path of a file to write)");
  write_file(dir / "afile", "x");
  expect_one_line_error(run_colossal("data tokenizer --text " + (dir / "text.txt") + " --vocab 600 --out " + (dir / "afile/t.model")),
                        "--out: " + (dir / "afile") + " is a file, not a directory");
  expect_one_line_error(run_colossal("data tokenizer --text " + (dir / "text.txt") + " --vocab 600 --out " + (dir / "afile/sub/t.model")),
                        "--out: cannot create directory " + (dir / "afile/sub") + " (" + (dir / "afile") + " is a file)");
  // Below what the text needs, the message says the number instead of SentencePiece's source line.
  auto small = run_colossal("data tokenizer --text " + (dir / "text.txt") + " --vocab 300 --out " + (dir / "s.model"));
  expect_one_line_error(small, "pieces this text needs");
  EXPECT_EQ(small.output.find(".cc("), std::string::npos) << small.output;
  auto t = run_colossal("data tokenizer --text " + (dir / "text.txt") + " --vocab 600 --out " + (dir / "t.model"));
  ASSERT_EQ(t.exit_code, 0) << t.output;
  EXPECT_NE(t.output.find("(600 pieces)"), std::string::npos) << t.output;
  expect_one_line_error(run_colossal("data prepare --text " + (dir / "text.txt") + " --tokenizer " + (dir / "t.model") + " --out " + (dir / "adir")),
                        "--out: " + (dir / "adir") + " is a directory");
  for (const auto& e : fs::directory_iterator(dir.path())) {   // nothing half-written beside the outputs
    const std::string name = e.path().filename().string();
    EXPECT_TRUE(name.find(".tmp-") == std::string::npos && name.find(".training-") == std::string::npos) << name;
  }
  auto p = run_colossal("data prepare --text " + (dir / "text.txt") + " --tokenizer " + (dir / "t.model") + " --out " + (dir / "d.h5"));
  ASSERT_EQ(p.exit_code, 0) << p.output;
  EXPECT_TRUE(fs::exists(dir / "d.h5"));
  EXPECT_NE(p.output.find("held-out tokens"), std::string::npos);
}

TEST(EndToEnd, ASecondInterruptStopsAtOnceAndLeavesTheLastCheckpointIntact) {
  TempDir dir;
  // Steps of about a second (64 micro-batches of 128 sequences) and a checkpoint after every one, so
  // both signals land inside one step: the first asks for a save after it, the second must not wait.
  auto recipe = colossal::test::tiny_training_recipe(dir / "run", 100000,
                                                     {"train.grad_accum=64", "checkpoint.every=1", "train.eval_every=0",
                                                      "train.batch_size=128", "model.dropout=0"});
  const auto run = train_until_first_checkpoint(dir, recipe);
  const pid_t pid = run.pid;
  const std::string& log = run.log;
  const fs::path& latest = run.latest;
  ASSERT_GE(pid, 0);
  ASSERT_TRUE(fs::exists(latest)) << read_file(log);
  kill(pid, SIGINT);
  // The second signal only once the first has been taken (two pending SIGINTs would merge into one).
  for (int i = 0; i < 100 && read_file(log).find("interrupted: saving after this step") == std::string::npos; ++i)
    usleep(10000);
  kill(pid, SIGINT);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << read_file(log);
  EXPECT_EQ(WEXITSTATUS(status), 130);
  const std::string out = read_file(log);
  EXPECT_NE(out.find("interrupted again: stopping now; the last complete checkpoint is unchanged"), std::string::npos) << out;
  // No save after the signals: the loop never reached its "saving and stopping" line.
  EXPECT_EQ(read_file(dir / "run" + "/train.log").find("saving and stopping"), std::string::npos);
  // `latest` names a complete checkpoint that infer loads.
  std::string name = read_file(latest.string());
  name.erase(name.find_last_not_of("\n") + 1);
  EXPECT_TRUE(fs::is_regular_file(latest.parent_path() / name / "model.safetensors")) << name;
  auto r = run_colossal("infer " + (dir / "run") + " -p In -n 3 --greedy -q");
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

// A second family through the same engine and commands: nothing in train, checkpointing or infer
// knows which family it runs.
// Each family's tiny recipe through the same engine: train, resume, save under transformers' names, generate.
struct FamilyRecipe {
  const char* family;
  const char* model_type;
  const char* architecture;
};
class FamilyEndToEnd : public ::testing::TestWithParam<FamilyRecipe> {};

TEST_P(FamilyEndToEnd, TinyRecipeTrainsResumesAndGeneratesFromItsHfCheckpoint) {
  TempDir dir;
  const std::string recipe = std::string("recipes/") + GetParam().family + "-tiny.toml";
  const std::string steps = " --set optim.warmup_steps=2 --set train.eval_every=4 --set checkpoint.every=4";
  auto train = run_colossal("train " + recipe + " --set train.max_steps=4" + steps + into(dir));
  ASSERT_EQ(train.exit_code, 0) << train.output;
  auto resume = run_colossal("train " + recipe + " --resume --set train.max_steps=8" + steps + into(dir));
  ASSERT_EQ(resume.exit_code, 0) << resume.output;
  EXPECT_NE(resume.output.find("resumed from"), std::string::npos) << resume.output;
  const auto config = nlohmann::json::parse(read_file(dir / "run/checkpoints/step-000008/config.json"));
  EXPECT_EQ(config["model_type"], GetParam().model_type);
  EXPECT_EQ(config["architectures"][0], GetParam().architecture);
  auto infer = run_colossal("infer " + (dir / "run") + " -p 'And God said' -n 12 --seed 1 -q");
  ASSERT_EQ(infer.exit_code, 0) << infer.output;
  EXPECT_EQ(infer.output.rfind("And God said", 0), 0u) << infer.output;
}

INSTANTIATE_TEST_SUITE_P(Families, FamilyEndToEnd,
                         ::testing::Values(FamilyRecipe{"opt", "opt", "OPTForCausalLM"}, FamilyRecipe{"bloom", "bloom", "BloomForCausalLM"}),
                         [](const auto& info) { return std::string(info.param.family); });

TEST(EndToEnd, AutomaticCheckpointingFitsItsTargetRecomputingFewerBlocksAsItGrows) {
  // GPT at 4 blocks (tiny) and at GPT-2 124M's width and depth, dropout on: each target's choice is
  // predicted within it, the step's measured tensor peak stays within the target plus what lives outside
  // the blocks (the no-recompute run's peak less its predicted block activations), losses equal keeping
  // every activation to the bit, and a target below one block's need is refused naming the least.
  TempDir dir;
  struct Shape {
    std::string name, args;
    std::vector<double> targets_gb;
  };
  // Targets from near the least that fits (all but the last block recomputed) to more than keeping every
  // block needs (tiny: 30 MiB a block, 120 in all; 124M at T = 64: 9 MiB a block, 108 in all).
  for (const Shape& shape : {Shape{"tiny", " --set model.n_layer=4", {0.035, 0.06, 0.09, 0.13}},
                             Shape{"124m", " --set model.n_layer=12 --set model.n_embd=768 --set model.n_head=12 --set train.batch_size=2"
                                           " --set train.seq_len=64", {0.02, 0.04, 0.07, 0.12}}}) {
    // Kernels pinned: the runs' losses are compared bit for bit, and choices timed per process can differ.
    const std::string common = shape.args + " --set model.dropout=0.1 --set train.max_steps=2 --set optim.warmup_steps=1"
                               " --set train.eval_every=0 --set checkpoint.every=0 --set checkpoint.at_end=false" + into(dir) +
                               colossal::test::pinned_kernels();
    auto train_with = [&](const std::string& name, const std::string& how) {
      const std::string out = dir / (shape.name + "-" + name);
      auto r = run_colossal("train recipes/gpt-tiny.toml -q" + common + how + " --set output.dir=" + out);
      EXPECT_EQ(r.exit_code, 0) << name << ": " << r.output;
      return out;
    };
    const std::string none = train_with("none", "");
    const auto loss_none = colossal::test::metric_values(none + "/metrics.jsonl", "loss");
    const double peak_none = colossal::test::metric_values(none + "/metrics.jsonl", "tensor_peak_mb").back();
    double last_count = 1e9, first_count = -1, outside = -1;
    for (double gb : shape.targets_gb) {
      const std::string out = train_with(std::to_string(gb), " --set memory.activation_checkpoint=auto --set memory.activation_memory_gb=" +
                                                                 std::to_string(gb));
      const double count = colossal::test::metric_values(out + "/metrics.jsonl", "recomputed_blocks").at(0);
      const double predicted = colossal::test::metric_values(out + "/metrics.jsonl", "predicted_activation_mb").at(0);
      const double whole = colossal::test::metric_values(out + "/metrics.jsonl", "activation_mb_kept_whole").at(0);
      if (outside < 0) outside = peak_none - whole;   // what the blocks' activations are not
      EXPECT_LE(predicted, gb * 1024 * (1 + 1e-9)) << shape.name << " " << gb;
      EXPECT_LE(colossal::test::metric_values(out + "/metrics.jsonl", "tensor_peak_mb").back(), gb * 1024 + outside + 0.05 * peak_none)
          << shape.name << " " << gb;
      EXPECT_EQ(colossal::test::metric_values(out + "/metrics.jsonl", "loss"), loss_none) << shape.name << " " << gb;
      EXPECT_LE(count, last_count) << shape.name << " " << gb;
      if (first_count < 0) first_count = count;
      last_count = count;
    }
    EXPECT_LT(last_count, first_count) << shape.name;
  }
  auto r = run_colossal("train recipes/gpt-tiny.toml --set memory.activation_checkpoint=auto --set memory.activation_memory_gb=0.0001" + into(dir));
  expect_one_line_error(r, "activation_memory_gb");
  EXPECT_NE(r.output.find("the smallest target that works is"), std::string::npos) << r.output;
  r = run_colossal("train recipes/gpt-tiny.toml --dry-run --set memory.activation_checkpoint=auto --set memory.activation_memory_gb=0.02" + into(dir));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("recompute   auto: recomputing"), std::string::npos) << r.output;
  expect_one_line_error(run_colossal("train recipes/gpt-tiny.toml --set memory.activation_checkpoint=auto" + into(dir)), "activation_memory_gb");
}
