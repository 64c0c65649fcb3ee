// Whole commands on a GPU machine, where a device of "auto" finds the GPU: `colossal profile` counts the
// GPU's bytes, and a job with more ranks on a node than it has GPUs trains on the CPU under "auto" and is
// refused under "cuda" before any rank connects (two ranks on one GPU fail at NCCL's first collective).
// Every test skips where no GPU is visible, as in CI; scripts/dev/gpu_check.sh runs them on a GPU machine.
#include <gtest/gtest.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <torch/cuda.h>

#include "tests/support/test_support.h"
#include "tests/support/train_runs.h"

using namespace colossal;
using test::read_json_file;
using test::run_colossal;
using test::TempDir;

#define SKIP_WITHOUT_GPU() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA GPU visible"

TEST(CudaJobs, ProfileCountsTheGpusBytesOfEveryBlock) {
  SKIP_WITHOUT_GPU();
  TempDir dir;
  const auto r = run_colossal("profile recipes/gpt-tiny.toml --steps 2 --out " + (dir / "profile") +
                              " --set train.device=cuda --set train.batch_size=2 --set train.seq_len=64 --set data.tokenizer=" +
                              (dir / "tok.model") + " --set data.dataset=" + (dir / "data.h5"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto p = read_json_file(dir / "profile/profile.json");
  const auto& t = p["totals"];
  for (const auto& b : p["blocks"]) {
    if (b["block"].is_string()) continue;   // the embeddings and the head: no forward of their own
    EXPECT_GT(b["activations"].get<double>(), 0) << b.dump();
    EXPECT_GT(b["forward_peak"].get<double>(), 0) << b.dump();
    EXPECT_GT(b["backward_peak"].get<double>(), 0) << b.dump();
  }
  // Every chunk lives on the GPU (no placement), so the step's live bytes there hold them all and more.
  EXPECT_GT(p["peak"]["bytes"].get<int64_t>(), t["params"].get<int64_t>() + t["grads"].get<int64_t>() + t["optimizer"].get<int64_t>());
}

TEST(CudaJobs, Bf16GradientShardsInHostMemoryFollowTheDeviceRun) {
  SKIP_WITHOUT_GPU();
  // bf16 under placement cpu with one micro-batch a step: the reduced gradients come back into bf16
  // shards in host memory (2 bytes a parameter) and the host's AdamW widens them as it reads them. The
  // same losses and norms as the device run, whose fp32 shards and AdamW are on the GPU (the norms sum
  // in other orders: close, not bit for bit).
  TempDir dir;
  auto train = [&](const std::string& name, const std::string& placement) {
    const auto r = run_colossal("train recipes/gpt-tiny.toml --quiet --set train.device=cuda --set precision.dtype=bf16 --set memory.zero=3 "
                                "--set memory.chunk_size_mb=0.01 --set train.grad_accum=1 --set train.max_steps=6 --set optim.warmup_steps=1 "
                                "--set train.eval_every=0 --set train.eval_batches=1 --set checkpoint.every=0 --set model.dropout=0 "
                                "--set memory.placement=" + placement + " --set output.dir=" + (dir / name) + " --set data.tokenizer=" +
                                (dir / "tok.model") + " --set data.dataset=" + (dir / "data.h5"));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return test::read_file(dir / name + "/train.log").find("gradient shards kept in the compute dtype") != std::string::npos;
  };
  EXPECT_FALSE(train("device", "device"));
  EXPECT_TRUE(train("cpu", "cpu"));
  for (const char* metric : {"loss", "grad_norm"}) {
    const auto device = test::metric_values(dir / "device/metrics.jsonl", metric);
    const auto cpu = test::metric_values(dir / "cpu/metrics.jsonl", metric);
    ASSERT_EQ(device.size(), 6u) << metric;
    ASSERT_EQ(cpu.size(), device.size()) << metric;
    for (size_t i = 0; i < device.size(); ++i) EXPECT_NEAR(cpu[i], device[i], 1e-3 * device[i]) << metric << ", step " << i + 1;
  }
}

TEST(CudaJobs, RanksThatOutnumberTheGpusTrainOnTheCpuUnderAutoAndAreRefusedUnderCuda) {
  SKIP_WITHOUT_GPU();
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES"); v != nullptr && *v != '\0')
    GTEST_SKIP() << "CUDA_VISIBLE_DEVICES=" << v << " is taken as a launcher's binding of each rank to its own GPUs";
  const int64_t ranks = static_cast<int64_t>(torch::cuda::device_count()) + 1;
  if (8 % ranks != 0) GTEST_SKIP() << ranks - 1 << " GPUs: the test's batch of 8 does not split across " << ranks << " ranks";
  TempDir dir;
  const std::string args = " --nproc-per-node " + std::to_string(ranks) + " --set train.batch_size=" + std::to_string(8 / ranks) +
                           " --set train.max_steps=2";
  const auto automatic = test::train(test::write_recipe(dir, "auto"), args + " --set train.device=auto");
  EXPECT_EQ(automatic.exit_code, 0) << automatic.output;
  const auto cuda = test::train(test::write_recipe(dir, "cuda"), args + " --set train.device=cuda");
  EXPECT_NE(cuda.exit_code, 0) << cuda.output;
  EXPECT_NE(cuda.output.find("each rank needs a GPU of its own"), std::string::npos) << cuda.output;
  EXPECT_EQ(cuda.output.find("NCCL"), std::string::npos) << "refused before any rank connected:\n" << cuda.output;
}
