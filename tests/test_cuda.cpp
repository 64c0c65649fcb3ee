// The CUDA path against the CPU one: the same model, fused loss, optimizer, training loop, checkpoints
// and generation on a GPU give the CPU's numbers (fp32, cuBLAS without TF32). Every test skips where
// no GPU is visible, as in CI; scripts/dev/gpu_check.sh builds and runs them on a GPU machine.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <array>
#include <ATen/core/grad_mode.h>
#include <torch/cuda.h>

#include "models/gpt/gpt.h"
#include "src/core/recipe.h"
#include "src/data/tokenizer.h"
#include "src/engine/checkpoint.h"
#include "models/registry.h"
#include "src/engine/generator.h"
#include "src/engine/trainer.h"
#include "src/nn/lm_head_loss.h"
#include "src/optim/adamw.h"
#include "src/dist/group.h"
#include "src/dist/runtime.h"
#include "src/nn/block_hooks.h"
#include "src/nn/alibi.h"
#include "src/nn/cached_attention.h"
#include "src/nn/causal_lm.h"
#include "src/nn/cuda_decode_attention.h"
#include "src/nn/kv_storage.h"
#include "src/parallel/sequence_attention.h"
#include "src/parallel/tensor_parallel_1d.h"
#include "src/memory/device_copies.h"
#include "src/memory/zero_strategy.h"
#include "src/io/safetensors.h"
#include "tests/support/test_support.h"
#include "kernels/cpu/adamw.h"
#include "kernels/cuda/built.h"
#if COLOSSAL_CUDA_KERNELS
#include <c10/cuda/CUDAStream.h>

#include "kernels/cuda/adamw.h"
#endif

using namespace colossal;
using colossal::test::TempDir;

#define SKIP_WITHOUT_GPU() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA GPU visible"

namespace {

const c10::Device kGpu(c10::kCUDA, 0);

std::shared_ptr<gpt::Gpt> make_gpt(uint64_t seed) {
  gpt::GptConfig c;
  c.n_layer = 2, c.n_head = 4, c.n_embd = 64, c.block_size = 48, c.vocab_size = 300, c.dropout = 0.0;
  at::manual_seed(seed);
  nn::LayerFactory f;
  auto m = std::make_shared<gpt::Gpt>(c, f);
  m->init_weights();
  return m;
}

// The same GPT's chunks under plain (stage 0) AdamW twice, on the CPU and on the GPU.
struct CpuAndGpuChunks {
  std::shared_ptr<gpt::Gpt> cpu = make_gpt(1), gpu = make_gpt(1);
  dist::Group alone_c{"dp"}, alone_g{"dp"};
  std::unique_ptr<memory::ZeroStrategy> zc, zg;
  CpuAndGpuChunks() {
    gpu->to(kGpu);
    auto make = [](nn::Module& m, dist::Group& g) {
      return std::make_unique<memory::ZeroStrategy>(m, memory::ZeroOptions{0, 4096, 0.1}, g,
                                                    std::make_unique<optim::AdamW>(optim::AdamWOptions{0.9, 0.95, 1e-8}));
    };
    zc = make(*cpu, alone_c);
    zg = make(*gpu, alone_g);
  }
  int64_t chunks() const { return zc->store().layout().chunks(); }
  void same_random_grads() {
    for (int64_t c = 0; c < chunks(); ++c) {
      auto grad = at::randn_like(zc->store().full_grads()[c]);
      zc->store().full_grads()[c].copy_(grad);
      zg->store().full_grads()[c].copy_(grad);
    }
  }
};

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kCPU).to(at::kDouble) - b.to(at::kCPU).to(at::kDouble)).abs().max().item<double>();
}

Recipe tiny_recipe(const std::string& out, int64_t max_steps, const std::string& device, double dropout) {
  return colossal::test::tiny_training_recipe(out, max_steps, {"train.device=" + device, "model.dropout=" + std::to_string(dropout)});
}

}  // namespace

TEST(Cuda, GptLossAndEveryGradientMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  auto cpu = make_gpt(7), gpu = make_gpt(7);
  gpu->to(kGpu);
  auto ids = at::randint(0, 300, {3, 40}, at::kLong), targets = at::randint(0, 300, {3, 40}, at::kLong);
  auto lc = cpu->loss(ids, targets), lg = gpu->loss(ids.to(kGpu), targets.to(kGpu));
  lc.backward();
  lg.backward();
  EXPECT_NEAR(lg.item<double>(), lc.item<double>(), 1e-5 * lc.item<double>());
  auto pc = cpu->named_parameters(), pg = gpu->named_parameters();
  ASSERT_EQ(pc.size(), pg.size());
  for (size_t i = 0; i < pc.size(); ++i) {
    ASSERT_TRUE(pg[i].value().is_cuda()) << pg[i].key();
    EXPECT_LT(max_abs_diff(pg[i].value().grad(), pc[i].value().grad()), 1e-5) << pc[i].key();
  }
}

TEST(Cuda, FusedLossMatchesTheCpuKernelWithIgnoredTargetsAndUpstreamScale) {
  SKIP_WITHOUT_GPU();
  at::manual_seed(3);
  auto x = at::randn({50, 24}).mul_(2), w = at::randn({1000, 24});
  auto targets = at::randint(0, 1000, {50}, at::kLong);
  targets[4] = -1;
  targets[31] = -1;
  auto xc = x.clone().requires_grad_(true), wc = w.clone().requires_grad_(true);
  auto xg = x.to(kGpu).requires_grad_(true), wg = w.to(kGpu).requires_grad_(true);
  auto lc = nn::lm_head_cross_entropy(xc, wc, targets), lg = nn::lm_head_cross_entropy(xg, wg, targets.to(kGpu));
  (lc * 0.25).backward();   // as with grad_accum = 4
  (lg * 0.25).backward();
  EXPECT_NEAR(lg.item<double>(), lc.item<double>(), 1e-5 * lc.item<double>());
  EXPECT_LT(max_abs_diff(xg.grad(), xc.grad()), 1e-6);
  EXPECT_LT(max_abs_diff(wg.grad(), wc.grad()), 1e-6);

  // Every target ignored: zero loss and zero gradients, not NaN.
  auto none = at::full({50}, -1, at::kLong).to(kGpu);
  auto xz = x.to(kGpu).requires_grad_(true);
  auto lz = nn::lm_head_cross_entropy(xz, w.to(kGpu), none);
  lz.backward();
  EXPECT_EQ(lz.item<double>(), 0.0);
  EXPECT_EQ(xz.grad().abs().max().item<double>(), 0.0);
}

#if COLOSSAL_CUDA_KERNELS
TEST(Cuda, TheAdamWKernelGivesTheCpuKernelsBitsOverManyPiecesWithClippingFoldedIn) {
  SKIP_WITHOUT_GPU();
  // 70 pieces (more than one launch's table holds) of 1 to 300,001 elements at odd offsets in one
  // buffer, three untouched elements between neighbours; a clipping scale and weight decay; five steps
  // against the CPU kernel (the same rounding, so the same bits) and AdamW's published rule in double.
  std::vector<std::pair<int64_t, int64_t>> spans;   // offset, length
  int64_t end = 1;
  for (int i = 0; i < 70; ++i) {
    const int64_t n = i == 40 ? 300001 : (i % 7 == 0 ? 1 + i : (i * 1543) % 20011 + 1);
    spans.push_back({end, n});
    end += n + 3;
  }
  at::manual_seed(11);
  const at::Tensor p0 = at::randn({end}), m0 = at::randn({end}).mul_(0.01), v0 = at::rand({end}).mul_(1e-4);
  at::Tensor pc = p0.clone(), mc = m0.clone(), vc = v0.clone();
  at::Tensor pg = p0.to(kGpu), mg = m0.to(kGpu), vg = v0.to(kGpu);
  at::Tensor pd = p0.to(at::kDouble), md = m0.to(at::kDouble), vd = v0.to(at::kDouble);
  const double b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1, scale = 0.37;
  for (int64_t step = 1; step <= 5; ++step) {
    const at::Tensor g = at::randn({end}).mul_(3), gg = g.to(kGpu);
    const double lr = 1e-3 * static_cast<double>(1 + step % 3);
    const kernels::AdamWHyper h{lr, b1, b2, eps, wd, step, scale};
    std::vector<kernels::AdamWDevicePiece> pieces;
    for (const auto& [off, n] : spans) {
      kernels::adamw_step(pc.data_ptr<float>() + off, g.data_ptr<float>() + off, mc.data_ptr<float>() + off, vc.data_ptr<float>() + off, n, h);
      pieces.push_back({pg.data_ptr<float>() + off, gg.data_ptr<float>() + off, mg.data_ptr<float>() + off, vg.data_ptr<float>() + off, n});
    }
    kernels::adamw_step_cuda(pieces.data(), static_cast<int64_t>(pieces.size()), h, c10::cuda::getCurrentCUDAStream().stream());
    // The rule in double: the CPU kernel's double copy, which AdamW.DoublePrecisionKernelFollowsThePublishedUpdateRule
    // holds to the published rule.
    const at::Tensor gd = g.to(at::kDouble);
    for (const auto& [off, n] : spans)
      kernels::adamw_step(pd.data_ptr<double>() + off, gd.data_ptr<double>() + off, md.data_ptr<double>() + off,
                          vd.data_ptr<double>() + off, n, h);
  }
  EXPECT_TRUE(at::equal(pg.cpu(), pc)) << "parameters differ from the CPU kernel by up to " << max_abs_diff(pg, pc);
  EXPECT_TRUE(at::equal(mg.cpu(), mc)) << "exp_avg differs by up to " << max_abs_diff(mg, mc);
  EXPECT_TRUE(at::equal(vg.cpu(), vc)) << "exp_avg_sq differs by up to " << max_abs_diff(vg, vc);
  EXPECT_LT(max_abs_diff(pg, pd), 2e-6);
  EXPECT_LT(max_abs_diff(vg, vd), 1e-6);   // exp_avg_sq reaches about 1 here: fp32 keeps ~1e-7 of it
  // Between the pieces nothing moved.
  const at::Tensor after = pg.cpu();
  for (size_t i = 0; i < spans.size(); ++i) {
    const int64_t gap = spans[i].first + spans[i].second;
    EXPECT_TRUE(at::equal(after.narrow(0, gap, 3), p0.narrow(0, gap, 3))) << "after piece " << i;
  }
  EXPECT_TRUE(at::equal(after.narrow(0, 0, 1), p0.narrow(0, 0, 1)));
}
#endif

TEST(Cuda, FusedAdamWFollowsTheCpuKernelOverTwentySteps) {
  SKIP_WITHOUT_GPU();
  CpuAndGpuChunks two;
  auto &zc = two.zc, &zg = two.zg;
  const int64_t chunks = two.chunks();
  ASSERT_GT(chunks, 1);
  for (int step = 0; step < 20; ++step) {
    two.same_random_grads();
    const double lr = 1e-3 * (1 + step % 3);
    zc->step(lr);
    zg->step(lr);
    for (int64_t c = 0; c < chunks; ++c) {
      if (COLOSSAL_CUDA_KERNELS) {   // kernels/cuda's AdamW rounds as the CPU's does
        EXPECT_TRUE(at::equal(zg->store().params()[c].cpu(), zc->store().params()[c])) << "chunk " << c << " step " << step;
        EXPECT_TRUE(at::equal(zg->store().state("exp_avg")[c].cpu(), zc->store().state("exp_avg")[c])) << "chunk " << c;
      }
      EXPECT_LT(max_abs_diff(zg->store().params()[c], zc->store().params()[c]), 1e-6) << "chunk " << c << " step " << step;
      EXPECT_LT(max_abs_diff(zg->store().state("exp_avg_sq")[c], zc->store().state("exp_avg_sq")[c]), 1e-6)
          << "chunk " << c << " step " << step;
    }
  }
}

TEST(Cuda, TheGradientNormOfGpuChunksIsTheCpusInOnePass) {
  // The device's chunks summed all at once (memory/sum_of_squares.h: each in fp32, then in double)
  // against the host's one-pass double sum of the same gradients; then clipping to half that norm.
  SKIP_WITHOUT_GPU();
  CpuAndGpuChunks two;
  auto &zc = two.zc, &zg = two.zg;
  two.same_random_grads();
  const double norm = zc->clip_grad_norm(0.0);
  EXPECT_NEAR(zg->clip_grad_norm(0.0), norm, 1e-6 * norm);
  EXPECT_NEAR(zg->clip_grad_norm(norm / 2), norm, 1e-6 * norm);
  EXPECT_NEAR(zg->clip_grad_norm(0.0), norm / 2, 1e-5 * norm);   // the pending clipping scale counts
  EXPECT_NEAR(zc->clip_grad_norm(norm / 2), norm, 1e-12 * norm);
  EXPECT_NEAR(zc->clip_grad_norm(0.0), norm / 2, 1e-5 * norm);
}

TEST(Cuda, OptimizerStatesOnNvmeUpdateGpuChunksAsInMemory) {
  SKIP_WITHOUT_GPU();
  // The same GPU model twice, AdamW's states in memory and on NVMe (slices staged on the host, updated
  // on the device): the same arithmetic, so the same parameters bit for bit.
  auto a = make_gpt(1), b = make_gpt(1);
  a->to(kGpu);
  b->to(kGpu);
  TempDir nvme;
  dist::Group alone_a("dp"), alone_b("dp");
  auto make = [](nn::Module& m, dist::Group& g, const std::string& dir) {
    memory::ZeroOptions o{0, 4096, 0.1};
    o.offload_dir = dir;
    o.offload_slice = 1000;
    return std::make_unique<memory::ZeroStrategy>(m, o, g, std::make_unique<optim::AdamW>(optim::AdamWOptions{0.9, 0.95, 1e-8}));
  };
  auto za = make(*a, alone_a, ""), zb = make(*b, alone_b, nvme.path());
  const int64_t chunks = za->store().layout().chunks();
  for (int step = 0; step < 5; ++step) {
    for (int64_t c = 0; c < chunks; ++c) {
      auto grad = at::randn_like(za->store().full_grads()[c]);
      za->store().full_grads()[c].copy_(grad);
      zb->store().full_grads()[c].copy_(grad);
    }
    za->step(1e-3);
    zb->step(1e-3);
  }
  for (int64_t c = 0; c < chunks; ++c) EXPECT_TRUE(at::equal(za->store().params()[c], zb->store().params()[c])) << "chunk " << c;
}

TEST(Cuda, GeminiPlacementsOnTheGpuFollowTheDeviceRunAndStayWithinTheirBudget) {
  SKIP_WITHOUT_GPU();
  // ZeRO-3 on the GPU with every chunk's data on the device, in host memory (placement cpu: shards
  // copied over before each gather, reduced gradients copied back, the host optimizer), and auto within
  // the device run's own peak (the first step measured, then data moved and gathered chunks kept,
  // evicted by next use). The budget is measured, not fixed: on a GPU the libraries' workspaces (cuBLAS
  // keeps 32 MiB on Hopper) outweigh this model's chunks, and differ between GPUs and versions.
  // The host's AdamW and the device's sum in other orders: close, not bit for bit.
  auto losses = [](const std::string& out, const std::vector<std::string>& extra) {
    std::vector<std::string> o = {"train.device=cuda", "model.dropout=0.0", "memory.zero=3", "memory.chunk_size_mb=0.01"};
    o.insert(o.end(), extra.begin(), extra.end());
    EXPECT_EQ(run_training(colossal::test::tiny_training_recipe(out, 8, o), {.quiet = true}), 0) << out;
    return colossal::test::metric_values(out + "/metrics.jsonl", "loss");
  };
  TempDir d, c, a;
  const auto device = losses(d.path(), {"memory.placement=device"});
  const double budget_mb = colossal::test::read_json_file(d / "summary.json").at("peak_device_mb").get<double>();
  ASSERT_GT(budget_mb, 0.0);
  const auto cpu = losses(c.path(), {"memory.placement=cpu"});
  const auto automatic = losses(a.path(), {"memory.placement=auto", "memory.device_memory_limit_gb=" + std::to_string(budget_mb / 1024)});
  ASSERT_EQ(device.size(), 8u);
  ASSERT_EQ(cpu.size(), 8u);
  ASSERT_EQ(automatic.size(), 8u);
  for (size_t i = 0; i < device.size(); ++i) {
    EXPECT_NEAR(cpu[i], device[i], 1e-4 * device[i]) << "placement cpu, step " << i + 1;
    EXPECT_NEAR(automatic[i], device[i], 1e-4 * device[i]) << "placement auto, step " << i + 1;
  }
  // The gradients that came back to the host (a side stream's copies under placement cpu) are the
  // device run's: their norms agree step by step.
  const auto norm_device = colossal::test::metric_values(d / "metrics.jsonl", "grad_norm");
  const auto norm_cpu = colossal::test::metric_values(c / "metrics.jsonl", "grad_norm");
  ASSERT_EQ(norm_cpu.size(), norm_device.size());
  for (size_t i = 0; i < norm_device.size(); ++i) EXPECT_NEAR(norm_cpu[i], norm_device[i], 1e-3 * norm_device[i]) << "step " << i + 1;
  const auto peaks = colossal::test::metric_values(a / "metrics.jsonl", "device_peak_mb");
  EXPECT_EQ(peaks.size(), 8u);
  for (double mb : peaks) EXPECT_LE(mb, budget_mb);
  // On a GPU with the states in host memory each host update runs beside the next forward
  // (overlap_update's auto); in place, the same host arithmetic follows the same losses.
  TempDir c2;
  const auto cpu_in_place = losses(c2.path(), {"memory.placement=cpu", "memory.overlap_update=off"});
  EXPECT_EQ(colossal::test::metric_values(c / "metrics.jsonl", "update_wait_ms").size(), 8u);
  EXPECT_TRUE(colossal::test::metric_values(c2 / "metrics.jsonl", "update_wait_ms").empty());
  ASSERT_EQ(cpu_in_place.size(), cpu.size());
  for (size_t i = 0; i < cpu.size(); ++i) EXPECT_NEAR(cpu[i], cpu_in_place[i], 1e-5 * cpu_in_place[i]) << "step " << i + 1;
}

TEST(Cuda, SideStreamCopiesComeAfterTheQueuedComputeAndBeforeWhatWaitsForThem) {
  // Gemini's transfers (memory/device_copies.h): a copy on the side stream must neither read a device
  // value the compute stream has yet to write, nor overwrite a device buffer it has yet to read; and
  // what waits for the ticket (the compute stream, or the host) sees the copied values. A slow chain of
  // products queued first keeps the compute stream busy, so a copy that did not wait would see the
  // stale value.
  SKIP_WITHOUT_GPU();
  memory::DeviceCopies copies(kGpu);
  ASSERT_TRUE(copies.active());
  const int64_t n = 1 << 20;
  at::manual_seed(3);
  const at::Tensor x = at::rand({2048, 2048}, at::TensorOptions().device(kGpu)) / 2048;
  auto slow = [&] {   // about a dozen milliseconds of products, finite, then a zero
    at::Tensor z = x;
    for (int i = 0; i < 40; ++i) z = z.matmul(x) + x;
    return z.flatten().narrow(0, 0, n) * 0;
  };

  // Device to host: the value is written at the end of the compute stream's queue.
  const at::Tensor written = at::empty({n}, x.options()).fill_(-1);
  const at::Tensor want = at::arange(n, x.options());
  written.copy_(slow() + want);
  at::Tensor host = memory::page_locked_empty(n, at::kFloat);
  EXPECT_TRUE(host.is_pinned());
  memory::CopyTicket down = copies.copy(host, written);
  copies.host_waits(down);
  EXPECT_FALSE(down.pending());
  EXPECT_TRUE(at::equal(host, want.cpu()));

  // Host to device: the compute stream reads the old buffer late in its queue, the copy overwrites it,
  // and a read after compute_waits sees the new values.
  const at::Tensor buffer = at::full({n}, 7.0, x.options());
  const at::Tensor read_old = slow() + buffer;
  at::Tensor fresh = memory::page_locked_empty(n, at::kFloat);
  fresh.copy_(at::arange(n, at::kFloat) * 3);
  memory::CopyTicket up = copies.copy(buffer, fresh);
  copies.compute_waits(up);
  const at::Tensor read_new = buffer * 1;
  EXPECT_TRUE(at::equal(read_old.cpu(), at::full({n}, 7.0)));
  EXPECT_TRUE(at::equal(read_new.cpu(), fresh));
}

TEST(Cuda, TrainingFollowsTheCpuLossCurveAndResumesWithItsDropoutStream) {
  SKIP_WITHOUT_GPU();
  // Without dropout the GPU run follows the CPU run step by step (fp32 reductions in another order).
  TempDir c, g;
  ASSERT_EQ(run_training(tiny_recipe(c.path(), 12, "cpu", 0.0), {.quiet = true}), 0);
  ASSERT_EQ(run_training(tiny_recipe(g.path(), 12, "cuda", 0.0), {.quiet = true}), 0);
  auto lc = colossal::test::metric_values(c / "metrics.jsonl", "loss");
  auto lg = colossal::test::metric_values(g / "metrics.jsonl", "loss");
  ASSERT_EQ(lc.size(), 12u);
  ASSERT_EQ(lg.size(), 12u);
  for (size_t i = 0; i < lc.size(); ++i) EXPECT_NEAR(lg[i], lc[i], 1e-3 * lc[i]) << "step " << i + 1;

  // With dropout, 6 steps + resume + 6 steps gives the 12-step run: the GPU generator's state is saved.
  // (Not bit-for-bit: some CUDA backward kernels accumulate with atomics.)
  TempDir a, b;
  ASSERT_EQ(run_training(tiny_recipe(a.path(), 12, "cuda", 0.1), {.quiet = true}), 0);
  ASSERT_EQ(run_training(tiny_recipe(b.path(), 6, "cuda", 0.1), {.quiet = true}), 0);
  ASSERT_EQ(run_training(tiny_recipe(b.path(), 12, "cuda", 0.1), {.resume = true, .quiet = true}), 0);
  auto la = colossal::test::metric_values(a / "metrics.jsonl", "loss");
  auto lb = colossal::test::metric_values(b / "metrics.jsonl", "loss");
  ASSERT_EQ(la.size(), 12u);
  ASSERT_EQ(lb.size(), 12u);
  for (size_t i = 0; i < la.size(); ++i) EXPECT_NEAR(lb[i], la[i], 1e-5 * la[i]) << "step " << i + 1;
}

TEST(Cuda, GreedyGenerationOnTheGpuMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  TempDir run;
  ASSERT_EQ(run_training(tiny_recipe(run.path(), 30, "cpu", 0.0), {.quiet = true}), 0);
  const std::string dir = resolve_checkpoint(run.path());
  auto info = read_checkpoint_info(dir);
  SamplingConfig greedy;
  greedy.greedy = true;
  greedy.max_tokens = 24;
  std::vector<std::string> prompts = {"In the beginning", "And the LORD said unto Moses,"};
  // the CPU; the GPU with its decoding steps as CUDA graphs (the default); the GPU op by op
  std::vector<std::string> texts[3];
  for (int d = 0; d < 3; ++d) {
    const c10::Device device = d == 0 ? c10::Device(c10::kCPU) : kGpu;
    nn::LayerFactory factory;
    auto model = nn::model_as<nn::CausalLM>(build_model(info.model, factory), "the test");
    load_model_state(*model, HfWeights::open(dir));
    model->to(device);
    Generator gen(model, Tokenizer::from_files(info.tokenizer_files, dir), device);
    gen.set_captured_decoding(d != 2);
    for (auto& r : gen.generate(prompts, greedy)) texts[d].push_back(r.text);
    const GenerationTiming& t = gen.last_timing();
    if (d == 1) {
      EXPECT_EQ(t.captured_steps, t.decode_steps);
      EXPECT_GE(t.captures, 1);
    } else {
      EXPECT_EQ(t.captured_steps, 0);
    }
  }
  EXPECT_EQ(texts[1], texts[0]);
  EXPECT_EQ(texts[2], texts[0]);
}

TEST(Cuda, DecodingAttentionOverANarrowCacheFollowsTheCpuKernelInEveryKind) {
  // kernels/cuda/decode_attention.h over fp16, bf16 and int8 caches against the CPU's decoding kernel on
  // a copy of the same steps: the GPU's cache (written by ATen's conversion or quantization) holds the
  // CPU kernel's bytes, and the outputs agree to fp32 rounding. Head sizes on and off the warp's width,
  // left padding masked, ALiBi; an fp32 cache keeps ATen's path.
  SKIP_WITHOUT_GPU();
  at::NoGradGuard no_grad;
  const std::array<int64_t, 4> shapes[] = {{2, 19, 3, 64}, {3, 11, 2, 24}, {1, 9, 2, 128}, {2, 6, 1, 5}};
  at::manual_seed(41);
  for (const auto dtype : {at::kHalf, at::kBFloat16, at::kChar})
    for (auto [b, steps, h, d] : shapes)
      for (auto [masked, alibi] : {std::pair{false, false}, {true, true}}) {
        const int64_t c = h * d, w = nn::kv_row_width(d, dtype);
        const at::Tensor slopes = alibi ? nn::alibi_slopes(h) : at::Tensor();
        nn::LayerKv cpu{at::zeros({b, h, steps, w}, dtype), at::zeros({b, h, steps, w}, dtype)};
        nn::LayerKv gpu{cpu.k.to(kGpu), cpu.v.to(kGpu)};
        const auto pad = at::randint(0, 3, {b}, at::kLong);
        for (int64_t step = 0; step < steps; ++step) {
          const auto qkv = at::randn({b, 1, 3 * c}) * 2;
          at::Tensor mask;
          if (masked) mask = (at::arange(step + 1).view({1, 1, 1, step + 1}) >= pad.view({b, 1, 1, 1})).contiguous();
          const auto want = nn::fused_decode_attention(qkv, cpu, step, h, mask, slopes);
          const auto got = nn::cuda_decode_attention(qkv.to(kGpu), gpu, step, h, mask.defined() ? mask.to(kGpu) : mask,
                                                     alibi ? slopes.to(kGpu) : slopes);
          const std::string where = std::string(c10::toString(dtype)) + " B=" + std::to_string(b) + " H=" + std::to_string(h) +
                                    " D=" + std::to_string(d) + " step " + std::to_string(step) + (masked ? " masked, alibi" : "");
          ASSERT_TRUE(got.has_value()) << where;
          EXPECT_LE(max_abs_diff(*got, want), 1e-5 * (1 + want.abs().max().item<double>())) << where;
          EXPECT_TRUE(at::equal(gpu.k.narrow(2, step, 1).cpu(), cpu.k.narrow(2, step, 1))) << where << ": the new key's bytes";
          EXPECT_TRUE(at::equal(gpu.v.narrow(2, step, 1).cpu(), cpu.v.narrow(2, step, 1))) << where << ": the new value's bytes";
        }
      }
  nn::LayerKv wide{at::zeros({1, 2, 4, 8}, at::TensorOptions().device(kGpu)), at::zeros({1, 2, 4, 8}, at::TensorOptions().device(kGpu))};
  EXPECT_FALSE(nn::cuda_decode_attention(at::randn({1, 1, 48}, at::TensorOptions().device(kGpu)), wide, 0, 2, {}).has_value())
      << "an fp32 cache keeps ATen's path";
}

TEST(Cuda, TensorAndSequenceParallelLayersOnAWorldOfOneNcclGroupMatchTheCpu) {
  // Issue 30's GPU check: the 1D layers (with and without Megatron's token split) and each sequence
  // mode on a CUDA model over a group of one NCCL rank (the sequence modes' gathers and all-to-alls run
  // real NCCL collectives; ring attention takes its whole-scores path), against the plain CPU model.
  SKIP_WITHOUT_GPU();
  dist::JoinOptions o;
  o.backend = "nccl";
  o.cuda = true;
  auto rt = dist::Runtime::join(dist::WorkerEnv{}, dist::MeshShape{}, o);
  ModelConfig c;
  c.family = "gpt", c.n_layer = 2, c.n_head = 4, c.n_embd = 32, c.block_size = 16, c.vocab_size = 64, c.dropout = 0.0;
  at::manual_seed(7);
  nn::LayerFactory plain;
  auto cpu = build_model(c, plain);
  const at::Tensor ids = at::randint(0, 64, {2, 16}, at::kLong), targets = at::randint(0, 64, {2, 16}, at::kLong);
  const at::Tensor want = dynamic_cast<nn::CausalLM&>(*cpu).loss(ids, targets);
  want.backward();
  for (const std::string layout : {"1d", "1d tokens", "split_gather", "ring", "all_to_all"}) {
    std::unique_ptr<nn::LayerFactory> f;
    if (layout.rfind("1d", 0) == 0) {
      auto tp = std::make_unique<parallel::TensorParallel1d>(rt->group(dist::Dim::tp));
      tp->split_block_tokens(layout == "1d tokens");
      f = std::move(tp);
    } else {
      f = std::make_unique<nn::LayerFactory>();
      f->set_sequence_attention(parallel::make_sequence_attention(parallel::parse_sequence_mode(layout), rt->group(dist::Dim::sp)));
    }
    auto gpu = build_model(c, *f, /*initialise=*/false);
    {
      at::NoGradGuard no_grad;
      auto from = cpu->named_parameters();
      for (auto& item : gpu->named_parameters()) item.value().copy_(from[item.key()]);
    }
    gpu->to(kGpu);
    const at::Tensor got = dynamic_cast<nn::CausalLM&>(*gpu).loss(ids.to(kGpu), targets.to(kGpu), at::arange(16, at::kLong).to(kGpu));
    got.backward();
    EXPECT_NEAR(got.item<double>(), want.item<double>(), 1e-5 * want.item<double>()) << layout;
    auto pc = cpu->named_parameters(), pg = gpu->named_parameters();
    ASSERT_EQ(pc.size(), pg.size());
    for (size_t i = 0; i < pc.size(); ++i) EXPECT_LT(max_abs_diff(pg[i].value().grad(), pc[i].value().grad()), 1e-5) << layout << " " << pc[i].key();
  }
  EXPECT_GT(rt->take_counters().calls, 0) << "the sequence modes ran NCCL collectives";
}

TEST(Cuda, RecomputedBlocksReplayTheGpuGeneratorSoGradientsWithDropoutAreBitIdentical) {
  // Activation checkpointing on the GPU: the rerun replays the CUDA generator's dropout draws.
  SKIP_WITHOUT_GPU();
  ModelConfig c;
  c.family = "gpt", c.n_layer = 2, c.n_head = 4, c.n_embd = 32, c.block_size = 16, c.vocab_size = 64, c.dropout = 0.1;
  auto build = [&] {
    at::manual_seed(7);
    nn::LayerFactory f;
    auto m = build_model(c, f);
    m->to(kGpu);
    m->train();
    return m;
  };
  auto keep = build(), rerun = build();
  auto hooks = std::make_shared<nn::BlockHooks>();
  hooks->set_recompute({true, true});
  rerun->set_block_hooks(hooks);
  const at::Tensor ids = at::randint(0, 64, {2, 16}, at::kLong).to(kGpu), targets = at::randint(0, 64, {2, 16}, at::kLong).to(kGpu);
  at::manual_seed(3);
  const at::Tensor a = dynamic_cast<nn::CausalLM&>(*keep).loss(ids, targets);
  a.backward();
  at::manual_seed(3);
  const at::Tensor b = dynamic_cast<nn::CausalLM&>(*rerun).loss(ids, targets);
  b.backward();
  EXPECT_TRUE(at::equal(a, b));
  auto pa = keep->named_parameters(), pb = rerun->named_parameters();
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(at::equal(pa[i].value().grad(), pb[i].value().grad())) << pa[i].key();
}
