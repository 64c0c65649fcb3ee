// Decoding steps over a fixed window with the position on the device (engine/decode_graphs.h): the step
// body against the generator's eager steps on the CPU, and its capture as CUDA graphs on a GPU, for every
// decoder family (BLOOM's ALiBi takes its query position from the device too), with ragged prompts.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/cuda.h>

#include "models/registry.h"
#include "src/engine/decode_graphs.h"
#include "src/engine/generator.h"
#include "src/nn/causal_lm.h"

using namespace colossal;

namespace {

std::shared_ptr<nn::CausalLM> tiny_decoder(const std::string& family, const c10::Device& device) {
  ModelConfig c;
  c.family = family;
  c.n_layer = 2, c.n_head = 4, c.n_embd = 64, c.block_size = 64, c.vocab_size = 300;
  at::manual_seed(3);
  nn::LayerFactory f;
  auto m = nn::model_as<nn::CausalLM>(build_model(c, f), "the test");
  m->to(device);
  m->eval();
  return m;
}

// A step's logits [B, V] from the next tokens [B] (CPU int64): the way under test.
using Stepper = std::function<at::Tensor(const at::Tensor& next)>;

// Prefills `pad.size()` left-padded random prompts of `longest` positions into an eager cache and a copy,
// then decodes to `capacity`: each step's logits from `make_stepper(copy)` against the generator's eager
// step (its positions and mask) on the first cache, both fed the eager step's greedy tokens.
void follow_eager_steps(const std::string& family, const c10::Device& device, const std::vector<int64_t>& pad, int64_t longest,
                        int64_t capacity, const std::function<Stepper(nn::CausalLM&, nn::KvCache&)>& make_stepper,
                        std::optional<at::ScalarType> kv_dtype = std::nullopt) {
  at::NoGradGuard no_grad;
  auto model = tiny_decoder(family, device);
  model->set_kv_dtype(kv_dtype);   // what both caches store (kv_element.h)
  const int64_t b = static_cast<int64_t>(pad.size());
  bool ragged = false;
  for (int64_t p : pad) ragged |= p > 0;
  const auto longs = at::TensorOptions().dtype(at::kLong);
  const at::Tensor pad_t = at::tensor(pad, longs).view({b, 1});
  nn::ForwardOptions prefill;
  nn::KvCache eager = model->make_cache(b, capacity, device);
  prefill.cache = &eager;
  prefill.last_only = true;
  if (ragged) {   // as generator.cpp builds them
    const auto pos = at::arange(longest, longs).view({1, longest});
    prefill.positions = (pos - pad_t).clamp_min(0).to(device);
    const auto q = pos.view({1, longest, 1}), k = pos.view({1, 1, longest});
    prefill.mask = ((k <= q) & ((k >= pad_t.view({b, 1, 1})) | (k == q))).unsqueeze(1).to(device);
  }
  at::Tensor logits = model->forward(at::randint(300, {b, longest}, longs).to(device), prefill).squeeze(1);
  nn::KvCache copy = eager;
  for (auto& layer : copy.layers) {
    layer.k = layer.k.clone();
    layer.v = layer.v.clone();
  }
  const Stepper step = make_stepper(*model, copy);
  for (int64_t at_pos = longest; at_pos < capacity; ++at_pos) {
    const at::Tensor next = logits.argmax(-1).to(at::kCPU);
    nn::ForwardOptions o;
    o.cache = &eager;
    o.last_only = true;
    if (ragged) {
      o.positions = (at::full({b, 1}, at_pos, longs) - pad_t).to(device);
      o.mask = (at::arange(at_pos + 1, longs).view({1, 1, 1, at_pos + 1}) >= pad_t.view({b, 1, 1, 1})).to(device);
    }
    logits = model->forward(next.view({b, 1}).to(device), o).squeeze(1);
    const at::Tensor got = step(next).to(at::kCPU, at::kDouble), want = logits.to(at::kCPU, at::kDouble);
    const double scale = want.abs().max().item<double>();
    EXPECT_LE((got - want).abs().max().item<double>(), 2e-5 * scale) << family << " at position " << at_pos;
    EXPECT_TRUE(at::equal(got.argmax(-1), want.argmax(-1))) << family << " at position " << at_pos;
  }
}

// The prompts' left padding and the cache's dtype of each run: ragged and aligned prompts over the
// model's own cache, and ragged ones over an fp16 cache and an int8 one (kv_element.h).
const std::pair<std::vector<int64_t>, std::optional<at::ScalarType>> kStepCases[] = {
    {{0, 3, 5}, std::nullopt}, {{0}, std::nullopt}, {{0, 3, 5}, at::kHalf}, {{0, 3, 5}, at::kChar}};

}  // namespace

TEST(WindowedDecoding, TheCapturedStepsBodyFollowsTheEagerStepsOnTheCpu) {
  // The body a graph captures, run eagerly on the CPU: positions and the write slot as tensors, the window
  // rounded up to 8 and masked. Ragged and aligned prompts; every family (BLOOM's bias from the slot); and
  // over caches of fp16 and int8 (the slot's write stores as the eager step's, the window read back for
  // attention).
  for (const std::string family : {"gpt", "opt", "bloom"}) {
    for (const auto& [pad, kv] : kStepCases) {
      follow_eager_steps(family, at::kCPU, pad, 6, 26, [&](nn::CausalLM& model, nn::KvCache& cache) -> Stepper {
        const int64_t b = static_cast<int64_t>(pad.size());
        const at::Tensor pad_d = at::tensor(pad, at::kLong).view({b, 1, 1, 1});
        zero_unfilled(cache);   // as DecodeGraphs does: masked keys are still read (times zero)
        return [&model, &cache, pad, pad_d, b](const at::Tensor& next) {
          const int64_t at_pos = cache.length, w = decode_window(at_pos, cache.capacity, 8);
          const at::Tensor positions = at::full({b, 1}, at_pos, at::kLong) - at::tensor(pad, at::kLong).view({b, 1});
          at::Tensor y = windowed_decode_step(model, cache, next.view({b, 1}), positions, at::full({1}, at_pos, at::kLong), pad_d, w);
          ++cache.length;
          return y.squeeze(1);
        };
      }, kv);
    }
  }
}

TEST(WindowedDecoding, GenerationOffTheGpuCapturesNothingAndSaysWhy) {
  auto model = tiny_decoder("gpt", at::kCPU);
  EXPECT_EQ(DecodeGraphs::unsupported(*model, at::kCPU), "the device is not a GPU");
  nn::KvCache cache = model->make_cache(1, 8, at::kCPU);
  EXPECT_THROW(DecodeGraphs(*model, cache, {0}, at::kCPU), std::exception);
}

TEST(CudaGraphs, CapturedStepsFollowTheEagerStepsAcrossWindowsInEveryFamily) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA GPU visible";
  const c10::Device gpu(c10::kCUDA, 0);
  for (const std::string family : {"gpt", "opt", "bloom"}) {
    // and over an fp16 cache (kv_element.h): the captured slot write rounds, the window is widened
    for (const auto& [pad, kv] : kStepCases) {
      std::shared_ptr<DecodeGraphs> graphs;
      follow_eager_steps(family, gpu, pad, 6, 26, [&](nn::CausalLM& model, nn::KvCache& cache) -> Stepper {
        EXPECT_EQ(DecodeGraphs::unsupported(model, gpu), "");
        graphs = std::make_shared<DecodeGraphs>(model, cache, pad, gpu, /*window_step=*/8);
        return [g = graphs](const at::Tensor& next) { return g->step(next); };
      }, kv);
      ASSERT_TRUE(graphs);
      EXPECT_EQ(graphs->captures(), 4) << family;   // windows of 8, 16, 24 and the capacity, 26
      EXPECT_EQ(graphs->window(), 26) << family;
    }
  }
}
