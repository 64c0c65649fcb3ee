// CPU kernels on every instruction set this machine runs (kernels/cpu/isa.h), each against a
// double-precision reference; the dispatch and its COLOSSAL_CPU_ISA cap; the decoding GEMV's
// batch-independence; the training GEMM in its three forms; decoding attention against the KV cache;
// LayerNorm; and the first-use choice between our kernels and ATen's (src/nn/kernel_choice.h).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>
#include <gtest/gtest.h>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>
#include <torch/csrc/autograd/function.h>

#include "kernels/cpu/adamw.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/gelu.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemv.h"
#include "kernels/cpu/accumulate.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/isa_kernels.h"
#include "kernels/cpu/stretches.h"
#include "kernels/cpu/thread_scratch.h"
#include "kernels/cpu/weight_streams.h"
#include "src/memory/allocation_counter.h"
#include "src/nn/activation.h"
#include "src/nn/alibi.h"
#include "src/nn/cached_attention.h"
#include "src/nn/fused_attention.h"
#include "src/nn/kv_storage.h"
#include "src/nn/kernel_choice.h"
#include "src/nn/layer_norm.h"
#include "src/nn/linear_forward.h"
#include "tests/support/test_support.h"

using namespace colossal;
using kernels::Isa;

namespace {

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

std::string what_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no exception)";
}

// Restores the default kernel policy (auto, nothing timed) when a test ends.
struct PolicyGuard {
  ~PolicyGuard() { nn::set_kernel_policy({}); }
};

}  // namespace

TEST(IsaDispatch, NamesRoundTripAndUnknownNamesAreRejected) {
  for (Isa isa : {Isa::baseline, Isa::avx2, Isa::avx512, Isa::avx512vnni, Isa::amx}) EXPECT_EQ(kernels::parse_isa(kernels::isa_name(isa)), isa);
  EXPECT_FALSE(kernels::parse_isa("sse4").has_value());
  EXPECT_FALSE(kernels::parse_isa("AVX2").has_value());
}

TEST(IsaDispatch, EnvironmentCapLowersTheSetAndRejectsWhatTheMachineCannotRun) {
  EXPECT_EQ(kernels::isa_cap_from(nullptr, Isa::avx512), Isa::avx512);
  EXPECT_EQ(kernels::isa_cap_from("", Isa::avx2), Isa::avx2);
  EXPECT_EQ(kernels::isa_cap_from("avx2", Isa::avx512), Isa::avx2);
  EXPECT_EQ(kernels::isa_cap_from("baseline", Isa::avx2), Isa::baseline);
  EXPECT_EQ(kernels::isa_cap_from("avx512", Isa::avx512), Isa::avx512);
  EXPECT_EQ(kernels::isa_cap_from("avx512", Isa::avx512vnni), Isa::avx512);   // AVX-512 without its VNNI dot products
  EXPECT_EQ(kernels::isa_cap_from("avx512vnni", Isa::amx), Isa::avx512vnni);   // the VNNI loop without AMX's tiles
  EXPECT_EQ(what_of([] { kernels::isa_cap_from("amx", Isa::avx512vnni); }),
            "COLOSSAL_CPU_ISA=amx: this CPU cannot run amx code (its widest is avx512vnni; valid here: baseline, avx2, avx512, avx512vnni)");
  EXPECT_EQ(what_of([] { kernels::isa_cap_from("avx512vnni", Isa::avx512); }),
            "COLOSSAL_CPU_ISA=avx512vnni: this CPU cannot run avx512vnni code (its widest is avx512; valid here: baseline, avx2, avx512)");
  EXPECT_EQ(what_of([] { kernels::isa_cap_from("avx512", Isa::avx2); }),
            "COLOSSAL_CPU_ISA=avx512: this CPU cannot run avx512 code (its widest is avx2; valid here: baseline, avx2)");
  EXPECT_EQ(what_of([] { kernels::isa_cap_from("avx", Isa::avx512); }),
            "COLOSSAL_CPU_ISA=\"avx\" is not an instruction set (valid: amx, avx512vnni, avx512, avx2, baseline)");
}

TEST(WeightStreams, TheEnvironmentSetsTheCountTheVendorDefaultsItAndAScopeWinsOverBoth) {
  const int vendor = kernels::weight_streams_from(nullptr);
  EXPECT_TRUE(vendor == 1 || vendor == 4) << vendor;
  EXPECT_EQ(kernels::weight_streams_from(""), vendor);
  for (int n = 1; n <= 4; ++n) EXPECT_EQ(kernels::weight_streams_from(std::to_string(n).c_str()), n);
  for (const char* bad : {"0", "5", "two", "4 "})
    EXPECT_EQ(what_of([&] { kernels::weight_streams_from(bad); }),
              "COLOSSAL_WEIGHT_STREAMS=\"" + std::string(bad) + "\" is not a count of weight streams a core (valid: 1, 2, 3, 4)");
  const int before = kernels::weight_streams();
  {
    kernels::ScopedWeightStreams two(2);
    EXPECT_EQ(kernels::weight_streams(), 2);
  }
  EXPECT_EQ(kernels::weight_streams(), before);
  EXPECT_THROW(kernels::ScopedWeightStreams(5), std::invalid_argument);
}

TEST(IsaDispatch, ScopedIsaSelectsThatSetsKernelsAndRestoresTheDefault) {
  const Isa before = kernels::active_isa();
  const int lanes[] = {4, 8, 16, 16, 16};
  for (Isa isa : kernels::runnable_isas()) {
    kernels::ScopedIsa cap(isa);
    EXPECT_EQ(kernels::active_isa(), isa);
    EXPECT_EQ(kernels::active_kernels().lanes, lanes[static_cast<int>(isa)]) << kernels::isa_name(isa);
  }
  EXPECT_EQ(kernels::active_isa(), before);
  if (kernels::machine_isa() < Isa::avx512vnni) {
    EXPECT_THROW(kernels::ScopedIsa{Isa::avx512vnni}, std::invalid_argument);   // braces: a temporary, not a declaration
  }
  if (kernels::machine_isa() < Isa::amx) {
    EXPECT_THROW(kernels::ScopedIsa{Isa::amx}, std::invalid_argument);
  }
}

TEST(IsaDispatch, TheBinaryRejectsABadCapWithOneLine) {
  setenv("COLOSSAL_CPU_ISA", "avx1024", 1);
  auto r = test::run_colossal("--version");
  unsetenv("COLOSSAL_CPU_ISA");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.output, "error: COLOSSAL_CPU_ISA=\"avx1024\" is not an instruction set (valid: amx, avx512vnni, avx512, avx2, baseline)\n");
  setenv("COLOSSAL_CPU_ISA", "baseline", 1);   // every machine runs baseline
  r = test::run_colossal("--version");
  unsetenv("COLOSSAL_CPU_ISA");
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

TEST(CpuKernels, AttentionMatchesDoublePrecisionSdpaOnEveryInstructionSet) {
  // Register-blocked head sizes (16, 32, 64, 128) and generic ones (8, 24), T from 1 to the maximum,
  // with lengths that end inside a register tile and inside a backward block of 48 queries.
  const std::array<int64_t, 4> shapes[] = {{2, 37, 3, 16}, {1, 1, 2, 8},    {3, 128, 4, 32}, {1, 256, 2, 64},
                                           {2, 19, 1, 128}, {1, 50, 2, 24}, {1, 33, 1, 64},  {2, 97, 2, 32},
                                           {1, 145, 1, 16}, {1, 7, 1, 32}};
  for (Isa isa : kernels::runnable_isas()) {
    kernels::ScopedIsa cap(isa);
    at::manual_seed(11);
    for (auto [b, t, h, d] : shapes) {
      const int64_t c = h * d;
      auto qkv = (at::randn({b, t, 3 * c}) * 2).requires_grad_(true);
      auto dy = at::randn({b, t, c});
      ASSERT_TRUE(nn::fused_attention_applies(qkv));
      auto y = nn::fused_causal_attention(qkv, h);
      y.backward(dy);

      auto qkv_d = qkv.detach().to(at::kDouble).requires_grad_(true);
      auto ref = nn::aten_causal_attention(qkv_d, h);
      ref.backward(dy.to(at::kDouble));
      const std::string where = std::string(kernels::isa_name(isa)) + " B=" + std::to_string(b) + " T=" +
                                std::to_string(t) + " H=" + std::to_string(h) + " D=" + std::to_string(d);
      EXPECT_LT(max_abs_diff(y.detach(), ref.detach()), 2e-5) << where;
      EXPECT_LT(max_abs_diff(qkv.grad(), qkv_d.grad()), 5e-5) << where;
    }
  }
}

TEST(CpuKernels, DecodeAttentionMatchesDoublePrecisionSdpaOverTheCacheOnEveryInstructionSet) {
  // Vector-multiple head sizes (64, 128: register-held outputs; 16) and odd ones (24, 5); cache lengths
  // 1 to 40 through successive steps; with and without a padding mask (the generator's left padding);
  // with and without ALiBi's distance bias (BLOOM; the reference adds alibi.h's bias tensor).
  const std::array<int64_t, 4> shapes[] = {{1, 40, 12, 64}, {3, 17, 2, 24}, {2, 9, 3, 128}, {1, 6, 1, 5}, {4, 21, 2, 16}};
  for (Isa isa : kernels::runnable_isas()) {
    kernels::ScopedIsa cap(isa);
    at::manual_seed(13);
    for (auto [b, steps, h, d] : shapes) {
      for (auto [masked, alibi] : {std::pair{false, false}, {true, false}, {false, true}, {true, true}}) {
        const int64_t c = h * d;
        const at::Tensor slopes = alibi ? nn::alibi_slopes(h) : at::Tensor();
        nn::LayerKv kv{at::zeros({b, h, steps, d}), at::zeros({b, h, steps, d})};
        nn::LayerKv ref{kv.k.to(at::kDouble), kv.v.to(at::kDouble)};
        auto pad = at::randint(0, 3, {b}, at::kLong);   // sequence i's first pad[i] positions are padding
        for (int64_t step = 0; step < steps; ++step) {
          auto qkv = at::randn({b, 1, 3 * c}) * 2;
          at::Tensor mask;
          if (masked) mask = (at::arange(step + 1).view({1, 1, 1, step + 1}) >= pad.view({b, 1, 1, 1})).contiguous();
          ASSERT_TRUE(nn::decode_step_applies(qkv, kv, step, mask));
          auto y = nn::fused_decode_attention(qkv, kv, step, h, mask, slopes);
          // ALiBi's reference: the bias of one query at position `step` over keys 0..step, -inf where masked
          const at::Tensor ref_mask =
              alibi ? nn::alibi_bias(slopes.to(at::kDouble), 1, step, step + 1, mask, /*causal=*/true) : mask;
          auto want = nn::aten_cached_attention(qkv.to(at::kDouble), ref, step, h, ref_mask);
          const std::string where = std::string(kernels::isa_name(isa)) + " B=" + std::to_string(b) + " H=" +
                                    std::to_string(h) + " D=" + std::to_string(d) + " step " + std::to_string(step) +
                                    (masked ? " masked" : "") + (alibi ? " alibi" : "");
          // A sequence whose every position so far is padding attends to nothing: ours gives zeros there.
          auto live = masked ? (pad <= step).view({b, 1, 1}) : at::ones({b, 1, 1}, at::kBool);
          want = at::where(live, want, at::zeros_like(want));
          ASSERT_LT(max_abs_diff(y, want), 2e-5) << where;
          ASSERT_LT(max_abs_diff(kv.k.narrow(2, step, 1), ref.k.narrow(2, step, 1)), 1e-6) << where;
          ASSERT_LT(max_abs_diff(kv.v.narrow(2, step, 1), ref.v.narrow(2, step, 1)), 1e-6) << where;
        }
      }
    }
  }
  // What the fused step does not take goes to ATen: several tokens, or a mask of another shape.
  nn::LayerKv kv{at::zeros({1, 2, 8, 4}), at::zeros({1, 2, 8, 4})};
  EXPECT_FALSE(nn::decode_step_applies(at::randn({1, 2, 24}), kv, 0, {}));
  EXPECT_FALSE(nn::decode_step_applies(at::randn({1, 1, 24}), kv, 3, at::ones({1, 1, 1, 3}, at::kBool)));
  EXPECT_FALSE(nn::decode_step_applies(at::randn({1, 1, 24}), kv, 8, {}));   // past the cache's capacity
}

TEST(CpuKernels, KeysAndValuesRoundInto16BitCachesAsAtensConversionOnEveryInstructionSet) {
  // kv_element.h's store: nearest-even, ties both ways, overflow to infinity past fp16's 65504, fp16's
  // subnormals, zeros and infinities, and lengths with a scalar tail after the vector body.
  std::vector<float> special = {0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 65519.0f, 65520.0f, -70000.0f, 1e-5f, -6e-8f, 3e-8f, 2.9e-8f,
                                6.1e-5f, 1.0f + 1.0f / 2048, 1.0f + 3.0f / 2048, 1.0f + 1.0f / 256, 1.0f + 3.0f / 256, 3.4e38f,
                                INFINITY, -INFINITY};
  at::manual_seed(19);
  const auto spread = at::randn({61}) * at::pow(10.0, at::randint(-9, 6, {61}).to(at::kFloat));
  for (int64_t i = 0; i < spread.numel(); ++i) special.push_back(spread[i].item<float>());
  const auto src = at::tensor(special);
  for (Isa isa : kernels::runnable_isas()) {
    const auto& k = kernels::isa_kernels(isa);
    for (const auto& [dtype, element] : {std::pair{at::kHalf, kernels::KvElement::fp16}, {at::kBFloat16, kernels::KvElement::bf16}})
      for (const int64_t n : {src.numel(), int64_t{7}, int64_t{16}}) {
        auto out = at::empty({n}, dtype);
        k.store_kv(src.const_data_ptr<float>(), out.mutable_data_ptr(), n, element);
        const auto want = src.narrow(0, 0, n).to(dtype);
        const auto bits = [](const at::Tensor& t) { return t.view(at::kShort); };
        EXPECT_TRUE(at::equal(bits(out), bits(want))) << kernels::isa_name(isa) << " " << dtype << " n=" << n << ": first differing "
                                                      << at::nonzero(bits(out) != bits(want)).flatten().narrow(0, 0, 1);
      }
  }
}

TEST(CpuKernels, KeysAndValuesQuantizeIntoInt8RowsByAtensRuleOnEveryInstructionSet) {
  // kv_element.h's int8 row: each set's store_kv writes the bytes ATen's to_kv_storage writes (values
  // and scale), over rows of spread magnitudes, exact ties of nearest-even (a row whose amax is 127 has
  // the factor 1, so 2.5 -> 2 and 3.5 -> 4), a row of zeros, rows below the smallest amax, a constant
  // row and lengths with a scalar tail. Reading back is within half a step of every value.
  at::manual_seed(29);
  std::vector<at::Tensor> rows;
  for (const int64_t n : {64, 7, 16, 5, 128, 24}) {
    for (int r = 0; r < 6; ++r) rows.push_back(at::randn({n}) * std::pow(10.0, r * 3 - 8));
    rows.push_back(at::zeros({n}));
    rows.push_back(at::full({n}, -0.75f));
    rows.push_back(at::full({n}, 1e-31f));
    rows.push_back(at::arange(n).to(at::kFloat) * 0.5f - 127.0f);   // amax 127: ties at every odd half
  }
  rows.push_back(at::tensor({127.0f, 2.5f, 3.5f, -2.5f, -3.5f, 0.5f, -0.5f, 1.5f, 126.5f, -126.5f}));
  for (Isa isa : kernels::runnable_isas()) {
    const auto& k = kernels::isa_kernels(isa);
    for (const auto& x : rows) {
      const int64_t n = x.numel();
      const std::string where = std::string(kernels::isa_name(isa)) + " n=" + std::to_string(n) + " amax " +
                                std::to_string(x.abs().max().item<float>());
      auto out = at::empty({nn::kv_row_width(n, at::kChar)}, at::kChar);
      k.store_kv(x.const_data_ptr<float>(), out.mutable_data_ptr(), n, kernels::KvElement::int8);
      const auto want = nn::to_kv_storage(x, at::kChar);
      ASSERT_EQ(want.sizes(), out.sizes()) << where;
      EXPECT_TRUE(at::equal(out, want)) << where << ": first differing byte "
                                        << at::nonzero(out != want).flatten().narrow(0, 0, 1);
      const auto back = nn::from_kv_storage(out, at::kFloat);
      const float step = x.abs().max().item<float>() / 127.0f;
      EXPECT_LE((back - x).abs().max().item<float>(), 0.5f * step * 1.0001f + (step < 1e-30f ? 1e-30f : 0.0f)) << where;
    }
  }
}

TEST(CpuKernels, DecodeAttentionOverANarrowCacheGivesItsFp32CopysBitsOnEveryInstructionSet) {
  // The same steps over an fp16, bf16 or int8 cache and over an fp32 cache holding the values the narrow
  // one reads back (rounded, or int8 times its row's scale): the kernel widens as it loads and computes
  // in fp32, so the outputs agree bit for bit, and the narrow cache holds the bytes ATen's path writes
  // for each new key and value. Vector-multiple head sizes and odd ones (the scalar tails); masks and
  // ALiBi as above.
  const std::array<int64_t, 4> shapes[] = {{2, 19, 3, 64}, {3, 11, 2, 24}, {1, 9, 2, 128}, {2, 6, 1, 5}};
  for (Isa isa : kernels::runnable_isas()) {
    kernels::ScopedIsa cap(isa);
    at::manual_seed(23);
    for (const auto dtype : {at::kHalf, at::kBFloat16, at::kChar})
      for (auto [b, steps, h, d] : shapes)
        for (auto [masked, alibi] : {std::pair{false, false}, {true, true}}) {
          const int64_t c = h * d, w = nn::kv_row_width(d, dtype);
          const at::Tensor slopes = alibi ? nn::alibi_slopes(h) : at::Tensor();
          nn::LayerKv narrow{at::zeros({b, h, steps, w}, dtype), at::zeros({b, h, steps, w}, dtype)};
          nn::LayerKv wide{at::zeros({b, h, steps, d}), at::zeros({b, h, steps, d})};
          auto pad = at::randint(0, 3, {b}, at::kLong);
          for (int64_t step = 0; step < steps; ++step) {
            auto qkv = at::randn({b, 1, 3 * c}) * 2;
            const auto heads = [&](int64_t part) { return qkv.narrow(2, part * c, c).view({b, 1, h, d}).transpose(1, 2); };
            auto rounded = qkv.clone();   // the key and value as the narrow cache reads them back
            for (int64_t part : {1, 2})
              rounded.narrow(2, part * c, c).view({b, 1, h, d}).transpose(1, 2).copy_(
                  nn::from_kv_storage(nn::to_kv_storage(heads(part), dtype), at::kFloat));
            at::Tensor mask;
            if (masked) mask = (at::arange(step + 1).view({1, 1, 1, step + 1}) >= pad.view({b, 1, 1, 1})).contiguous();
            ASSERT_TRUE(nn::decode_step_applies(qkv, narrow, step, mask));
            const auto y = nn::fused_decode_attention(qkv, narrow, step, h, mask, slopes);
            const auto want = nn::fused_decode_attention(rounded, wide, step, h, mask, slopes);
            const std::string where = std::string(kernels::isa_name(isa)) + " " + c10::toString(dtype) + " B=" + std::to_string(b) +
                                      " H=" + std::to_string(h) + " D=" + std::to_string(d) + " step " + std::to_string(step) +
                                      (masked ? " masked, alibi" : "");
            ASSERT_TRUE(at::equal(y, want)) << where << ": max diff " << max_abs_diff(y, want);
            ASSERT_TRUE(at::equal(nn::from_kv_storage(narrow.k.narrow(2, step, 1), at::kFloat), wide.k.narrow(2, step, 1))) << where;
            ASSERT_TRUE(at::equal(nn::from_kv_storage(narrow.v.narrow(2, step, 1), at::kFloat), wide.v.narrow(2, step, 1))) << where;
            ASSERT_TRUE(at::equal(narrow.k.narrow(2, step, 1), nn::to_kv_storage(heads(1), dtype))) << where << ": ATen's bytes";
            ASSERT_TRUE(at::equal(narrow.v.narrow(2, step, 1), nn::to_kv_storage(heads(2), dtype))) << where << ": ATen's bytes";
          }
        }
  }
}

TEST(CpuKernels, LayerNormAndItsGradientsMatchDoublePrecisionOnEveryInstructionSet) {
  // Vector-multiple widths (128, 768) and odd ones (24, 5); row counts across block boundaries (32 rows),
  // inputs with a large mean (the two-pass variance must not cancel).
  const std::vector<int64_t> shapes[] = {{2, 37, 128}, {70, 768}, {3, 7, 24}, {1, 1, 5}, {64, 33}};
  for (Isa isa : kernels::runnable_isas()) {
    kernels::ScopedIsa cap(isa);
    at::manual_seed(17);
    for (const auto& shape : shapes) {
      const int64_t c = shape.back();
      auto x = (at::randn(shape) * 3 + 20).requires_grad_(true);
      auto w = (at::randn({c}) + 1).requires_grad_(true), b = at::randn({c}).requires_grad_(true);
      auto dy = at::randn(shape);
      auto y = nn::fused_layer_norm(x, w, b, 1e-5);
      y.backward(dy);
      auto xd = x.detach().to(at::kDouble).requires_grad_(true), wd = w.detach().to(at::kDouble).requires_grad_(true),
           bd = b.detach().to(at::kDouble).requires_grad_(true);
      auto ref = nn::aten_layer_norm(xd, wd, bd, 1e-5);
      ref.backward(dy.to(at::kDouble));
      const std::string where = std::string(kernels::isa_name(isa)) + " " + c10::str(at::IntArrayRef(shape));
      // Relative to the outputs' size: at width 768 with mean 20 they reach ~25, where 2e-5 is 14 float
      // ulps, and the sanitizer build's code (RelWithDebInfo) lands at 2.6e-5 there, Release below 2e-5.
      EXPECT_LT(max_abs_diff(y.detach(), ref.detach()), 2e-6 * (1 + ref.abs().max().item<double>())) << where;
      EXPECT_LT(max_abs_diff(x.grad(), xd.grad()), 5e-5) << where;
      EXPECT_LT(max_abs_diff(w.grad(), wd.grad()), 2e-4) << where;
      EXPECT_LT(max_abs_diff(b.grad(), bd.grad()), 2e-4) << where;
    }
  }
}

TEST(CpuKernels, LayerNormGivesTheSameBitsOnAnyThreadCount) {
  at::manual_seed(23);
  auto x = at::randn({300, 96}).requires_grad_(true);
  auto w = at::randn({96}).requires_grad_(true), b = at::randn({96}).requires_grad_(true);
  auto dy = at::randn({300, 96});
  std::vector<at::Tensor> first;
  const int threads = at::get_num_threads();
  for (int n : {1, 2, 3}) {
    at::set_num_threads(n);
    for (auto* t : {&x, &w, &b}) t->mutable_grad() = at::Tensor();
    auto y = nn::fused_layer_norm(x, w, b, 1e-5);
    y.backward(dy);
    std::vector<at::Tensor> got{y.detach(), x.grad(), w.grad(), b.grad()};
    if (first.empty()) first = got;
    for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(at::equal(got[i], first[i])) << n << " threads, output " << i;
  }
  at::set_num_threads(threads);
}

TEST(CpuKernels, GeluMatchesTheDoublePrecisionFormulaOnEveryInstructionSet) {
  at::manual_seed(5);
  // 40001 elements: several chunks and a vector tail; plus the saturating and tiny values.
  auto x = at::cat({at::randn({40001}) * 3, at::tensor({0.0f, 1e-6f, -1e-3f, 5.f, -5.f, 12.f, -40.f, 300.f, -300.f})});
  auto dy = at::randn_like(x);
  auto xd = x.to(at::kDouble).requires_grad_(true);
  auto ref = at::gelu(xd, "tanh");
  ref.backward(dy.to(at::kDouble));
  auto rel = [](const at::Tensor& a, const at::Tensor& b) { return ((a.to(at::kDouble) - b) / (b.abs() + 1)).abs().max().item<double>(); };
  for (Isa isa : kernels::runnable_isas()) {
    kernels::ScopedIsa cap(isa);
    auto y = at::empty_like(x), y2 = at::empty_like(x), dydx = at::empty_like(x);
    kernels::gelu_tanh_forward(x.const_data_ptr<float>(), y.mutable_data_ptr<float>(), x.numel());
    kernels::gelu_tanh_forward_with_grad(x.const_data_ptr<float>(), y2.mutable_data_ptr<float>(),
                                         dydx.mutable_data_ptr<float>(), x.numel());
    // ATen's own float GELU errs by ~2.5e-6 near |x| = 5 (tanh saturates); the same bar here.
    EXPECT_LT(rel(y, ref.detach()), 5e-6) << kernels::isa_name(isa);
    EXPECT_TRUE(at::equal(y2, y)) << kernels::isa_name(isa);   // training and inference compute the same
    EXPECT_LT(rel(dydx * dy, xd.grad()), 5e-6) << kernels::isa_name(isa);
  }
}

TEST(CpuKernels, SoftmaxCrossEntropyMatchesDoublePrecisionOnEveryInstructionSet) {
  at::manual_seed(7);
  const int64_t rows = 13, cols = 1003;   // odd width: a vector tail on every set
  auto logits = at::randn({rows, cols}) * 4;
  auto targets = at::randint(0, cols, {rows}, at::kLong);
  targets[4] = -1;   // ignored row: zero loss, zero gradient
  auto ld = logits.to(at::kDouble).requires_grad_(true);
  auto ref_losses = at::cross_entropy_loss(ld, targets, {}, at::Reduction::None, -1);
  (ref_losses.sum() * 0.5).backward();
  for (Isa isa : kernels::runnable_isas()) {
    kernels::ScopedIsa cap(isa);
    auto g = logits.clone();
    auto losses = at::empty({rows});
    kernels::softmax_cross_entropy_inplace(g.mutable_data_ptr<float>(), targets.const_data_ptr<int64_t>(),
                                           losses.mutable_data_ptr<float>(), rows, cols, 0.5f);
    EXPECT_LT(max_abs_diff(losses, ref_losses.detach()), 1e-5) << kernels::isa_name(isa);
    EXPECT_LT(max_abs_diff(g, ld.grad()), 5e-7) << kernels::isa_name(isa);
  }
}

TEST(CpuKernels, AdamWFollowsThePublishedRuleOnEveryInstructionSet) {
  // The published rule (Loshchilov & Hutter, as torch.optim.AdamW orders it), in double, five steps;
  // the even steps' gradients clipped by 0.7, which the kernel applies as it reads them.
  const kernels::AdamWHyper h0{1e-2, 0.9, 0.95, 1e-8, 0.1, 0};
  const int64_t n = 1037;
  auto clip = [](int64_t s) { return s % 2 == 0 ? 0.7 : 1.0; };
  auto p0 = at::randn({n}, at::kDouble), grads = at::randn({5, n}, at::kDouble);
  auto ref = p0.clone(), m = at::zeros({n}, at::kDouble), v = at::zeros({n}, at::kDouble);
  for (int64_t s = 1; s <= 5; ++s) {
    auto g = grads[s - 1] * clip(s);
    ref.mul_(1 - h0.lr * h0.weight_decay);
    m = m * h0.beta1 + g * (1 - h0.beta1);
    v = v * h0.beta2 + g * g * (1 - h0.beta2);
    auto mhat = m / (1 - std::pow(h0.beta1, s)), vhat = v / (1 - std::pow(h0.beta2, s));
    ref -= h0.lr * mhat / (vhat.sqrt() + h0.eps);
  }
  for (Isa isa : kernels::runnable_isas()) {
    kernels::ScopedIsa cap(isa);
    auto pd = p0.clone(), md = at::zeros({n}, at::kDouble), vd = at::zeros({n}, at::kDouble);
    auto pf = p0.to(at::kFloat), mf = at::zeros({n}), vf = at::zeros({n});
    for (int64_t s = 1; s <= 5; ++s) {
      auto h = h0;
      h.step = s;
      h.grad_scale = clip(s);
      auto g = grads[s - 1].contiguous();
      auto gf = g.to(at::kFloat);
      kernels::adamw_step<double>(pd.mutable_data_ptr<double>(), g.const_data_ptr<double>(), md.mutable_data_ptr<double>(),
                                  vd.mutable_data_ptr<double>(), n, h);
      kernels::adamw_step<float>(pf.mutable_data_ptr<float>(), gf.const_data_ptr<float>(), mf.mutable_data_ptr<float>(),
                                 vf.mutable_data_ptr<float>(), n, h);
    }
    EXPECT_LT(max_abs_diff(pd, ref), 1e-12) << kernels::isa_name(isa);
    EXPECT_LT(max_abs_diff(pf, ref), 1e-5) << kernels::isa_name(isa);
  }
}

TEST(CpuKernels, HalfGradientsAddIntoFp32ShardsAsAtensMixedAddOnEveryInstructionSet) {
  // Several threads' blocks and a ragged tail; normals, subnormals, zeros of both signs, infinities and
  // NaNs of both 16-bit formats, against ATen's fp32.add_(half) bit for bit (NaNs as NaNs).
  const int64_t n = 4 * 65536 + 1037;
  at::manual_seed(3);
  const at::Tensor base = at::randn({n}) * 4;
  for (auto dtype : {at::kBFloat16, at::kHalf}) {
    at::Tensor part = (at::randn({n}) * at::pow(10.0, at::randint(-8, 4, {n}).to(at::kFloat))).to(dtype);
    const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 6e-8f, -6e-8f, 3e-5f, 1e-40f, 65504.0f, -2.5f};
    for (int64_t i = 0; i < static_cast<int64_t>(std::size(specials)); ++i) part[i * 7 + 1] = specials[i];
    const at::Tensor want = base.clone().add_(part);
    for (Isa isa : kernels::runnable_isas()) {
      kernels::ScopedIsa cap(isa);
      at::Tensor got = base.clone();
      kernels::accumulate_half(got.mutable_data_ptr<float>(), static_cast<const uint16_t*>(part.const_data_ptr()), n,
                               dtype == at::kBFloat16 ? kernels::Half16::bf16 : kernels::Half16::fp16);
      EXPECT_TRUE(at::equal(got.isnan(), want.isnan())) << kernels::isa_name(isa) << " " << dtype;
      EXPECT_TRUE(at::equal(got.nan_to_num(0), want.nan_to_num(0))) << kernels::isa_name(isa) << " " << dtype;
      EXPECT_TRUE(at::equal(got.nan_to_num(0).signbit(), want.nan_to_num(0).signbit())) << kernels::isa_name(isa) << " " << dtype;   // -0.0
    }
  }
}

TEST(CpuKernels, AdamWOverHalfGradientsGivesTheBitsOfItsWidenedScaledCopyOnEveryInstructionSet) {
  // Compact gradient shards: 16-bit gradients widened and times their factor as the kernel reads them
  // must update exactly as the fp32 kernel over `half.to(float).mul_(factor)` does, with clipping's
  // scale on top. Several threads' grains, a ragged tail, subnormal fp16 values and zeros of both signs;
  // factors of a loss scale (a power of two) and of anything else; three steps so the moments matter.
  const int64_t n = 3 * 32768 + 1037;
  at::manual_seed(5);
  const at::Tensor p0 = at::randn({n});
  for (auto dtype : {at::kBFloat16, at::kHalf}) {
    for (double factor : {1.0, 1.0 / 1024, 0.37}) {
      std::vector<at::Tensor> grads;
      for (int s = 0; s < 3; ++s) {
        at::Tensor g = (at::randn({n}) * at::pow(10.0, at::randint(-6, 2, {n}).to(at::kFloat))).to(dtype);
        const float specials[] = {0.0f, -0.0f, 6e-8f, -6e-8f, 3e-5f, 1e-40f, -2.5f};
        for (int64_t i = 0; i < static_cast<int64_t>(std::size(specials)); ++i) g[i * 5 + 3] = specials[i];
        grads.push_back(g.contiguous());
      }
      for (Isa isa : kernels::runnable_isas()) {
        kernels::ScopedIsa cap(isa);
        at::Tensor p = p0.clone(), m = at::zeros({n}), v = at::zeros({n});
        at::Tensor pr = p0.clone(), mr = at::zeros({n}), vr = at::zeros({n});
        for (int s = 0; s < 3; ++s) {
          const kernels::AdamWHyper h{1e-2, 0.9, 0.95, 1e-8, 0.1, s + 1, s == 1 ? 0.7 : 1.0};
          kernels::adamw_step_half(p.mutable_data_ptr<float>(), static_cast<const uint16_t*>(grads[s].const_data_ptr()),
                                   dtype == at::kBFloat16 ? kernels::Half16::bf16 : kernels::Half16::fp16, m.mutable_data_ptr<float>(),
                                   v.mutable_data_ptr<float>(), n, h, factor);
          at::Tensor wide = grads[s].to(at::kFloat);
          if (factor != 1.0) wide.mul_(factor);
          kernels::adamw_step<float>(pr.mutable_data_ptr<float>(), wide.const_data_ptr<float>(), mr.mutable_data_ptr<float>(),
                                     vr.mutable_data_ptr<float>(), n, h);
        }
        const std::string what = std::string(kernels::isa_name(isa)) + " " + c10::toString(dtype) + " factor " + std::to_string(factor);
        EXPECT_TRUE(at::equal(p, pr)) << what;
        EXPECT_TRUE(at::equal(m, mr)) << what;
        EXPECT_TRUE(at::equal(v, vr)) << what;
        EXPECT_FALSE(at::equal(p, p0)) << what;   // it did update
      }
    }
  }
}

TEST(CpuKernels, SumOfSquaresIsTheDoubleSumOnEveryInstructionSetWhateverTheThreads) {
  // Several blocks and a ragged tail; values spread over six decades so float accumulation would drift.
  const int64_t n = 5 * 65536 + 1234;
  const auto x = (at::randn({n}) * at::pow(10.0, at::randint(-3, 3, {n}).to(at::kFloat))).contiguous();
  const double ref = x.to(at::kDouble).pow(2).sum().item<double>();
  const auto xd = x.to(at::kDouble).contiguous();
  const int threads = at::get_num_threads();
  for (Isa isa : kernels::runnable_isas()) {
    kernels::ScopedIsa cap(isa);
    at::set_num_threads(1);
    const double one = kernels::sum_squares(x.const_data_ptr<float>(), n);
    at::set_num_threads(std::max(2, threads));
    const double many = kernels::sum_squares(x.const_data_ptr<float>(), n);
    EXPECT_NEAR(one, ref, 1e-11 * ref) << kernels::isa_name(isa);
    EXPECT_EQ(one, many) << kernels::isa_name(isa) << ": the sum depends on the thread count";
    EXPECT_NEAR(kernels::sum_squares(xd.const_data_ptr<double>(), n), ref, 1e-11 * ref) << kernels::isa_name(isa);
    EXPECT_EQ(kernels::sum_squares(x.const_data_ptr<float>(), 0), 0.0);
  }
  at::set_num_threads(threads);
}

TEST(CpuKernels, SumOfSquaresOfHalfValuesIsThatOfTheirFp32CopyOnEveryInstructionSet) {
  // Compact gradient shards' norm: the bits the same gradients give in fp32 shards, whatever the threads.
  const int64_t n = 5 * 65536 + 1234;
  const int threads = at::get_num_threads();
  for (auto dtype : {at::kBFloat16, at::kHalf}) {
    at::Tensor x = (at::randn({n}) * at::pow(10.0, at::randint(-3, 3, {n}).to(at::kFloat))).to(dtype);
    x[3] = 6e-8f;   // an fp16 subnormal
    const at::Tensor wide = x.to(at::kFloat);
    const auto kind = dtype == at::kBFloat16 ? kernels::Half16::bf16 : kernels::Half16::fp16;
    const auto* bits = static_cast<const uint16_t*>(x.const_data_ptr());
    for (Isa isa : kernels::runnable_isas()) {
      kernels::ScopedIsa cap(isa);
      const double want = kernels::sum_squares(wide.const_data_ptr<float>(), n);
      at::set_num_threads(1);
      EXPECT_EQ(kernels::sum_squares_half(bits, n, kind), want) << kernels::isa_name(isa) << " " << dtype;
      at::set_num_threads(std::max(2, threads));
      EXPECT_EQ(kernels::sum_squares_half(bits, n, kind), want) << kernels::isa_name(isa) << " " << dtype;
      EXPECT_NEAR(want, wide.to(at::kDouble).pow(2).sum().item<double>(), 1e-11 * want);
    }
  }
  at::set_num_threads(threads);
}

TEST(CpuKernels, GemvMatchesDoublePrecisionMatmulOnEveryInstructionSetAndWeightStreamCount) {
  at::manual_seed(13);
  for (Isa isa : kernels::runnable_isas()) {
    kernels::ScopedIsa cap(isa);
    for (int streams : {1, 4}) {
      kernels::ScopedWeightStreams layout(streams);
      for (int64_t rows : {1, 2, 3, 4, 5, 8})
        for (int64_t in : {1, 7, 64, 100, 768})
          for (int64_t out : {1, 5, 33, 1000})
            for (bool bias : {false, true}) {
              auto x = at::randn({rows, in}), w = at::randn({out, in});
              auto b = bias ? at::randn({out}) : at::Tensor();
              auto y = at::empty({rows, out});
              kernels::gemv(x.const_data_ptr<float>(), rows, in, w.const_data_ptr<float>(),
                            bias ? b.const_data_ptr<float>() : nullptr, y.mutable_data_ptr<float>(), out);
              auto ref = at::mm(x.to(at::kDouble), w.to(at::kDouble).t());
              if (bias) ref += b.to(at::kDouble);
              // Float dot products of length `in` with unit-variance terms: error ~ sqrt(in) ulp-scale.
              EXPECT_LT(max_abs_diff(y, ref), 2e-6 * in + 1e-6) << kernels::isa_name(isa) << " streams=" << streams << " rows=" << rows
                                                               << " in=" << in << " out=" << out << " bias=" << bias;
            }
    }
  }
}

TEST(CpuKernels, TransposedGemvMatchesDoublePrecisionAndGivesEachRowItsBitsAloneInABatchOrOnAnyThreadCount) {
  at::manual_seed(19);
  for (Isa isa : kernels::runnable_isas()) {
    kernels::ScopedIsa cap(isa);
    for (int64_t rows : {1, 2, 3, 4, 5, 8, 13})
      for (int64_t in : {1, 7, 9, 64, 100, 768})
        for (int64_t out : {1, 5, 33, 1000})
          for (bool bias : {false, true}) {
            auto x = at::randn({rows, in}), wt = at::randn({in, out});   // W^T as the file holds it
            auto b = bias ? at::randn({out}) : at::Tensor();
            auto run = [&](const at::Tensor& xs) {
              auto y = at::empty({xs.size(0), out});
              kernels::gemv_t(xs.const_data_ptr<float>(), xs.size(0), in, wt.const_data_ptr<float>(),
                              bias ? b.const_data_ptr<float>() : nullptr, y.mutable_data_ptr<float>(), out);
              return y;
            };
            const std::string what = std::string(kernels::isa_name(isa)) + " rows=" + std::to_string(rows) + " in=" + std::to_string(in) +
                                     " out=" + std::to_string(out) + " bias=" + std::to_string(bias);
            auto y = run(x);
            auto ref = at::mm(x.to(at::kDouble), wt.to(at::kDouble));
            if (bias) ref += b.to(at::kDouble);
            EXPECT_LT(max_abs_diff(y, ref), 2e-6 * in + 1e-6) << what;
            if (in != 100 || out != 1000) continue;   // bits: one shape with tails in both dimensions
            for (int64_t r = 0; r < rows; ++r)
              EXPECT_TRUE(at::equal(run(x.narrow(0, r, 1).contiguous()), y.narrow(0, r, 1))) << what << " row " << r;
            const int threads = at::get_num_threads();
            at::set_num_threads(1);
            auto single_thread = run(x);
            at::set_num_threads(threads);
            EXPECT_TRUE(at::equal(single_thread, y)) << what;
          }
  }
}

TEST(CpuKernels, GemvGivesEachRowTheSameBitsAloneInABatchOnAnyThreadCountAndInAnyWeightStreams) {
  at::manual_seed(17);
  const int64_t out = 1003;   // no multiple of 2, 3 or 4: every stream layout leaves outputs over
  // 131 inputs: whole 16-float steps and a scalar tail; 139: one 8-float vector between them. Sixteen
  // rows: AVX-512's two passes of eight (one 16-lane chain a row); eleven: a pass of eight and one of three.
  for (const int64_t in : {131, 139}) {
    auto x = at::randn({16, in}), w = at::randn({out, in}), b = at::randn({out});
    auto run = [&](const at::Tensor& xs) {
      auto y = at::empty({xs.size(0), out});
      kernels::gemv(xs.const_data_ptr<float>(), xs.size(0), in, w.const_data_ptr<float>(), b.const_data_ptr<float>(),
                    y.mutable_data_ptr<float>(), out);
      return y;
    };
    for (Isa isa : kernels::runnable_isas()) {
      kernels::ScopedIsa cap(isa);
      at::Tensor one_stream;
      for (int streams = 1; streams <= 4; ++streams) {
        kernels::ScopedWeightStreams layout(streams);
        const std::string what = std::string(kernels::isa_name(isa)) + " in=" + std::to_string(in) + " streams=" + std::to_string(streams);
        auto together = run(x);
        if (streams == 1) one_stream = together;
        EXPECT_TRUE(at::equal(together, one_stream)) << what;
        for (int64_t r = 0; r < 16; ++r)
          EXPECT_TRUE(at::equal(run(x.narrow(0, r, 1).contiguous()), together.narrow(0, r, 1))) << what << " row " << r;
        for (int64_t n : {2, 3, 4, 8, 11})
          EXPECT_TRUE(at::equal(run(x.narrow(0, 0, n)), together.narrow(0, 0, n))) << what << " rows " << n;
        const int threads = at::get_num_threads();   // LibTorch and the kernels share one OpenMP runtime
        at::set_num_threads(1);
        auto single_thread = run(x);
        at::set_num_threads(threads);
        EXPECT_TRUE(at::equal(single_thread, together)) << what;
      }
    }
  }
}

namespace {

// The three forms of kernels::gemm a dense layer uses, on float data, against double precision.
enum class GemmForm { Forward, InputGrad, WeightGrad };

at::Tensor run_gemm(GemmForm form, const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, const at::Tensor& dy,
                    at::Tensor c, bool accumulate) {
  const int64_t m = x.size(0), in = w.size(1), out = w.size(0);
  const float *xp = x.const_data_ptr<float>(), *wp = w.const_data_ptr<float>(), *dyp = dy.const_data_ptr<float>();
  switch (form) {
    case GemmForm::Forward:
      kernels::gemm({m, out, in, xp, in, 1, wp, 1, in, c.mutable_data_ptr<float>(), out,
                     b.defined() ? b.const_data_ptr<float>() : nullptr, accumulate});
      break;
    case GemmForm::InputGrad:
      kernels::gemm({m, in, out, dyp, out, 1, wp, in, 1, c.mutable_data_ptr<float>(), in, nullptr, accumulate});
      break;
    case GemmForm::WeightGrad:
      kernels::gemm({out, in, m, dyp, 1, out, xp, in, 1, c.mutable_data_ptr<float>(), in, nullptr, accumulate});
      break;
  }
  return c;
}

// Whether y was computed by the dense GEMM's autograd function (under the view that restores its shape).
// Whether y's graph, followed through each node's first input, has a node whose name contains `node`.
bool graph_has(const at::Tensor& y, const std::string& node) {
  for (auto fn = y.grad_fn(); fn; fn = fn->next_edges().empty() ? nullptr : fn->next_edges()[0].function)
    if (fn->name().find(node) != std::string::npos) return true;
  return false;
}

bool through_gemm(const at::Tensor& y) { return graph_has(y, "DenseLinearFunction"); }

}  // namespace

TEST(CpuKernels, GemmMatchesDoublePrecisionInEveryFormOnEveryInstructionSet) {
  at::manual_seed(23);
  // Rows ending inside a tile (1, 7, 37), columns ending inside a tile and past a 256-column panel
  // (16, 48, 96, 560: last strips of one, three and two vectors for AVX-512's 6 x 4 tiles), depths past
  // a pass over B with a remainder (300, 560: 256-step passes on AVX2, one pass on AVX-512; 1100:
  // 512-step passes there).
  for (Isa isa : kernels::runnable_isas()) {
    kernels::ScopedIsa cap(isa);
    for (int64_t m : {1, 7, 37, 1100})
      for (int64_t in : {16, 48, 96, 560})
        for (int64_t out : {16, 80, 304})
          for (GemmForm form : {GemmForm::Forward, GemmForm::InputGrad, GemmForm::WeightGrad}) {
            auto x = at::randn({m, in}), w = at::randn({out, in}), b = at::randn({out}), dy = at::randn({m, out});
            auto xd = x.to(at::kDouble), wd = w.to(at::kDouble), dyd = dy.to(at::kDouble);
            at::Tensor ref, c;
            int64_t depth = 0;
            switch (form) {
              case GemmForm::Forward: ref = at::addmm(b.to(at::kDouble), xd, wd.t()), c = at::empty({m, out}), depth = in; break;
              case GemmForm::InputGrad: ref = at::mm(dyd, wd), c = at::empty({m, in}), depth = out; break;
              case GemmForm::WeightGrad: ref = at::mm(dyd.t(), xd), c = at::empty({out, in}), depth = m; break;
            }
            const std::string where = std::string(kernels::isa_name(isa)) + " form=" + std::to_string(int(form)) +
                                      " m=" + std::to_string(m) + " in=" + std::to_string(in) + " out=" + std::to_string(out);
            // Float sums of `depth` unit-variance products: error grows like sqrt(depth) ulps of the terms.
            const double tol = 2e-6 * depth + 1e-5;
            EXPECT_LT(max_abs_diff(run_gemm(form, x, w, b, dy, c, false), ref), tol) << where;
            // Accumulating adds onto what the output holds (a gradient buffer's earlier sums).
            auto earlier = at::randn(ref.sizes());
            auto sum = run_gemm(form, x, w, b, dy, earlier.clone(), true);
            EXPECT_LT(max_abs_diff(sum, ref + earlier.to(at::kDouble)), tol) << where << " accumulate";
          }
  }
}

// The GEMM packs its operands into this buffer and reads them in whole vectors: a buffer 16 bytes past
// a cache line (std::vector's own start) split every 512-bit load in two.
TEST(CpuKernels, ThreadScratchStartsOnACacheLineAsItGrows) {
  for (size_t floats : {size_t{1}, size_t{1000}, size_t{1} << 20, size_t{3} << 20}) {
    float* p = kernels::thread_scratch(floats);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % kernels::kScratchAlignBytes, 0u) << floats << " floats";
    p[0] = 1.0f, p[floats - 1] = 2.0f;   // the whole span is the caller's (ASan would catch an overrun)
  }
}

TEST(CpuKernels, GemmGivesTheSameBitsOnAnyThreadCount) {
  at::manual_seed(29);
  // 203 rows: C's rows split among the threads. 5 rows (one tile): its columns split instead, 1040 of
  // them (65 units of 16, uneven among 2 or 3 threads, past four 256-column panels); the weight
  // gradient of that shape has 1040 rows again. A weight gradient of 4208 rows packs dY in two stretches
  // of rows on one thread (past kGemmPackedRowsMax) and in one on 2 or 3.
  static_assert(kernels::kGemmPackedRowsMax < 4208 && kernels::kGemmPackedRowsMax >= 4208 / 2 + 8);
  for (auto [m, in, out] : {std::array<int64_t, 3>{203, 96, 272}, std::array<int64_t, 3>{5, 512, 1040}, std::array<int64_t, 3>{20, 32, 4208}}) {
    auto x = at::randn({m, in}), w = at::randn({out, in}), b = at::randn({out}), dy = at::randn({m, out});
    for (Isa isa : kernels::runnable_isas()) {
      kernels::ScopedIsa cap(isa);
      for (GemmForm form : {GemmForm::Forward, GemmForm::InputGrad, GemmForm::WeightGrad}) {
        auto shape = form == GemmForm::Forward ? std::vector<int64_t>{m, out}
                     : form == GemmForm::InputGrad ? std::vector<int64_t>{m, in}
                                                   : std::vector<int64_t>{out, in};
        auto together = run_gemm(form, x, w, b, dy, at::empty(shape), false);
        const int threads = at::get_num_threads();
        for (int t : {1, 2, 3}) {
          at::set_num_threads(t);
          auto other = run_gemm(form, x, w, b, dy, at::empty(shape), false);
          at::set_num_threads(threads);
          EXPECT_TRUE(at::equal(other, together)) << kernels::isa_name(isa) << " form=" << int(form) << " m=" << m << " threads=" << t;
        }
      }
    }
  }
}

TEST(LinearForward, TrainingShapesMatchATenInValueAndGradientsAndSumTheWeightGradientIntoItsBuffer) {
  PolicyGuard guard;
  nn::KernelPolicy ours;
  ours.gemm = nn::KernelPath::Ours;
  nn::set_kernel_policy(ours);
  at::manual_seed(31);
  auto x = at::randn({3, 37, 48}).requires_grad_(true);
  auto w = at::randn({80, 48}).requires_grad_(true), b = at::randn({80}).requires_grad_(true);
  auto dy = at::randn({3, 37, 80});
  auto y = nn::linear_forward(x, w, b);
  EXPECT_TRUE(through_gemm(y));
  EXPECT_EQ(y.sizes(), (at::IntArrayRef{3, 37, 80}));
  y.backward(dy);

  auto xd = x.detach().to(at::kDouble).requires_grad_(true);
  auto wd = w.detach().to(at::kDouble).requires_grad_(true), bd = b.detach().to(at::kDouble).requires_grad_(true);
  auto yd = at::linear(xd, wd, bd);
  yd.backward(dy.to(at::kDouble));
  EXPECT_LT(max_abs_diff(y, yd.detach()), 1e-4);
  EXPECT_LT(max_abs_diff(x.grad(), xd.grad()), 1e-4);
  EXPECT_LT(max_abs_diff(w.grad(), wd.grad()), 1e-3);
  EXPECT_LT(max_abs_diff(b.grad(), bd.grad()), 1e-4);

  // A second backward with .grad already a buffer: summed into that same storage (no new tensor).
  const void* storage = w.grad().data_ptr();
  nn::linear_forward(x, w, b).backward(dy);
  EXPECT_EQ(w.grad().data_ptr(), storage);
  EXPECT_LT(max_abs_diff(w.grad(), 2 * wd.grad()), 2e-3);
  EXPECT_LT(max_abs_diff(b.grad(), 2 * bd.grad()), 2e-4);

  // Widths that are not multiples of 16, and a forced ATen policy, stay on at::linear.
  auto w2 = at::randn({30, 48}).requires_grad_(true);
  EXPECT_FALSE(through_gemm(nn::linear_forward(x, w2)));
  nn::KernelPolicy aten;
  aten.gemm = nn::KernelPath::Aten;
  nn::set_kernel_policy(aten);
  EXPECT_FALSE(through_gemm(nn::linear_forward(x, w, b)));
}

// An MLP's projection of its GELU'd hidden layer (linear_forward_after_gelu_tanh): one node that keeps h
// alone and computes the GELU again in backward, with the bits of the GELU node and the product node it
// replaces, forward and backward, and two tensors of h's size fewer held between them.
TEST(LinearForward, TheProjectionAfterGeluKeepsOnlyItsInputAndGivesTheTwoNodesBits) {
  PolicyGuard guard;
  nn::KernelPolicy ours;
  ours.gelu = ours.gemm = nn::KernelPath::Ours;
  nn::set_kernel_policy(ours);
  at::manual_seed(41);
  const auto h0 = at::randn({3, 37, 64}), w0 = at::randn({80, 64}), b0 = at::randn({80}), dy = at::randn({3, 37, 80});
  struct Run {
    at::Tensor y, dh, dw, db;
    int64_t held;   // bytes the forward left allocated: its output and what its graph saved
  };
  auto run = [&](bool fused) {
    auto h = h0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true), b = b0.clone().requires_grad_(true);
    at::Tensor y;
    int64_t held = 0;
    {
      memory::AllocationCounter counter;
      y = fused ? nn::linear_forward_after_gelu_tanh(h, w, b) : nn::linear_forward(nn::gelu_tanh(h), w, b);
      held = counter.live();
    }
    EXPECT_EQ(graph_has(y, "GeluDenseLinearFunction"), fused);
    y.backward(dy);
    return Run{y.detach(), h.grad(), w.grad(), b.grad(), held};
  };
  nn::gelu_tanh(h0.clone().requires_grad_(true));   // the GELU's choice timed outside the counted forwards
  nn::linear_forward_after_gelu_tanh(h0.clone().requires_grad_(true), w0.clone().requires_grad_(true), b0);
  const Run fused = run(true), two = run(false);
  EXPECT_TRUE(at::equal(fused.y, two.y));
  EXPECT_TRUE(at::equal(fused.dh, two.dh));
  EXPECT_TRUE(at::equal(fused.dw, two.dw));
  EXPECT_TRUE(at::equal(fused.db, two.db));
  EXPECT_EQ(two.held - fused.held, 2 * h0.numel() * 4) << "the GELU's output and derivative are not kept";
  // Against double precision, the GELU written out.
  auto hd = h0.to(at::kDouble);
  auto gd = 0.5 * hd * (1 + at::tanh(0.7978845608028654 * (hd + 0.044715 * hd.pow(3))));
  EXPECT_LT(max_abs_diff(fused.y, at::linear(gd, w0.to(at::kDouble), b0.to(at::kDouble))), 1e-4);
  // Without a gradient to record (the inference policy's GEMM), or with ATen's GEMM forced: the two
  // nodes' path as before.
  {
    at::NoGradGuard no_grad;
    EXPECT_LT(max_abs_diff(nn::linear_forward_after_gelu_tanh(h0, w0, b0), fused.y.to(at::kDouble)), 1e-4);
  }
  nn::KernelPolicy aten = ours;
  aten.gemm = nn::KernelPath::Aten;
  nn::set_kernel_policy(aten);
  const auto y = nn::linear_forward_after_gelu_tanh(h0.clone().requires_grad_(true), w0, b0);
  EXPECT_FALSE(graph_has(y, "GeluDenseLinearFunction"));
}

TEST(LinearForward, AutoTimesEachFormOncePerShape) {
  PolicyGuard guard;
  at::manual_seed(37);
  auto x = at::randn({64, 32}).requires_grad_(true);
  auto w = at::randn({48, 32}).requires_grad_(true), b = at::randn({48}).requires_grad_(true);
  nn::linear_forward(x, w, b).sum().backward();
  nn::linear_forward(x, w, b).sum().backward();   // .grad is now a buffer: the summing form
  auto choices = nn::kernel_choices();
  for (const char* form : {"fwd", "dx", "dw", "dw+"})
    EXPECT_EQ(choices.count(std::string("gemm ") + form + " rows=64 in=32 out=48"), 1u) << form;
}

TEST(KernelChoice, AForcedPathRunsWithoutTiming) {
  PolicyGuard guard;
  int calls = 0;
  auto count = [&] { ++calls; };
  EXPECT_TRUE(nn::use_ours("attention", nn::KernelPath::Ours, "s", count, count));
  EXPECT_FALSE(nn::use_ours("attention", nn::KernelPath::Aten, "s", count, count));
  EXPECT_EQ(calls, 0);
  EXPECT_TRUE(nn::kernel_choices().empty());
}

TEST(KernelChoice, AutoTimesBothOnceKeepsTheFasterAndRemembersIt) {
  PolicyGuard guard;
  int ours = 0, aten = 0;
  auto fast = [&] { ++ours; };
  auto slow = [&] {
    ++aten;
    volatile double s = 0;
    for (int i = 0; i < 2000000; ++i) s = s + i;
  };
  EXPECT_TRUE(nn::use_ours("gelu", nn::KernelPath::Auto, "n=1", fast, slow));
  EXPECT_EQ(ours, 7);   // two warm-ups and five timed calls each
  EXPECT_EQ(aten, 7);
  EXPECT_TRUE(nn::use_ours("gelu", nn::KernelPath::Auto, "n=1", slow, fast));   // remembered: not timed again
  EXPECT_EQ(ours + aten, 14);
  EXPECT_FALSE(nn::use_ours("gelu", nn::KernelPath::Auto, "n=2", slow, fast));  // a new shape is timed
  EXPECT_EQ((nn::kernel_choices()), (std::map<std::string, std::string>{{"gelu n=1", "fused"}, {"gelu n=2", "aten"}}));
}

namespace {

// Busy for `ms` of wall time (not a count of operations), so both sides' durations hold on any CPU.
std::function<void()> busy_for(double ms, int& calls) {
  return [ms, &calls] {
    ++calls;
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double, std::milli>(ms);
    while (std::chrono::steady_clock::now() < end) {
    }
  };
}

}  // namespace

TEST(KernelChoice, ANearTieIsTimedLongerAndKeepsOursUnlessAtenIsClearlyFaster) {
  PolicyGuard guard;
  int ours = 0, aten = 0;
  // ATen 1% faster: a near tie, timed ten rounds more, and ours is kept.
  EXPECT_TRUE(nn::use_ours("gemm", nn::KernelPath::Auto, "tie", busy_for(0.505, ours), busy_for(0.5, aten)));
  EXPECT_EQ(ours, 17);   // two warm-ups, five timed calls and ten more
  EXPECT_EQ(aten, 17);
  // ATen 8% faster: still within 10%, so timed longer, and then taken.
  ours = aten = 0;
  EXPECT_FALSE(nn::use_ours("gemm", nn::KernelPath::Auto, "close", busy_for(0.54, ours), busy_for(0.5, aten)));
  EXPECT_EQ(ours, 17);
  // ATen a third faster: decided on the first five rounds.
  ours = aten = 0;
  EXPECT_FALSE(nn::use_ours("gemm", nn::KernelPath::Auto, "clear", busy_for(0.75, ours), busy_for(0.5, aten)));
  EXPECT_EQ(ours, 7);
  EXPECT_EQ((nn::kernel_choices()),
            (std::map<std::string, std::string>{{"gemm clear", "aten"}, {"gemm close", "aten"}, {"gemm tie", "fused"}}));
}

// A decoding GEMV's weight is evicted before every timed call (linear_forward.cpp): the preparation
// runs before each call of either side, warm-ups included, and its time counts for neither.
TEST(KernelChoice, APreparationRunsBeforeEveryCallUntimed) {
  PolicyGuard guard;
  int ours = 0, aten = 0, prepared = 0;
  std::string order;
  auto side = [&](char name, double ms, int& calls) {
    return [&, name, ms, call = busy_for(ms, calls)] {
      order += name;
      call();
    };
  };
  int idle = 0;
  auto prepare = [&, slow = busy_for(5.0, idle)] {
    ++prepared;
    order += 'p';
    if (order.size() % 4 == 1) slow();   // only before ours: counted, it would make ours 10x slower
  };
  EXPECT_TRUE(nn::use_ours("gemv", nn::KernelPath::Auto, "prep", side('o', 0.5, ours), side('a', 0.75, aten), prepare));
  EXPECT_EQ(ours, 7);   // ATen clearly slower: two warm-ups and five timed calls each
  EXPECT_EQ(aten, 7);
  EXPECT_EQ(prepared, 14);
  std::string expected;
  for (int i = 0; i < 7; ++i) expected += "popa";
  EXPECT_EQ(order, expected);
}

TEST(KernelChoice, RestoredChoicesAreUsedAndBadOnesRejected) {
  PolicyGuard guard;
  nn::restore_kernel_choices({{"attention B=1 T=8 H=1 D=8 fwd", "aten"}});
  auto never = [] { FAIL() << "a restored choice must not be timed again"; };
  EXPECT_FALSE(nn::use_ours("attention", nn::KernelPath::Auto, "B=1 T=8 H=1 D=8 fwd", never, never));
  EXPECT_THROW(nn::restore_kernel_choices({{"gelu n=1", "fast"}}), std::invalid_argument);
  EXPECT_EQ(nn::parse_kernel_path("fused"), nn::KernelPath::Ours);
  EXPECT_EQ(what_of([] { nn::parse_kernel_path("cuda"); }), "\"cuda\" is not a kernel choice (valid: auto, fused, aten)");
}

TEST(Stretches, EveryItemIsTakenOnceInRunsWhateverTheThreadsAndTheirSpeeds) {
  // The decoding GEMVs' and block steps' split (stretches.h): each thread takes its own stretch from the
  // front and then the others' backs; every item must run exactly once, also when one thread is slow
  // and the others take most of its stretch, when a thread never comes, and reused across calls.
  kernels::Stretches share;
  for (const int threads : {1, 2, 3, 4})
    for (const int64_t items : {0, 1, 5, 37, 1000})
      for (const int absent : {-1, threads - 1}) {
        if (absent >= 0 && threads == 1) continue;   // someone must come
        std::vector<std::atomic<int>> seen(static_cast<size_t>(items));
        std::atomic<int64_t> runs{0};
        share.reset(items, threads);
        std::vector<std::thread> pool;
        for (int t = 0; t < threads; ++t) {
          if (t == absent) continue;
          pool.emplace_back([&, t] {
            share.work(t, [&](int64_t b, int64_t e) {
              EXPECT_LT(b, e);
              if (t == 0) std::this_thread::sleep_for(std::chrono::microseconds(50));   // a slow core
              for (int64_t i = b; i < e; ++i) seen[static_cast<size_t>(i)].fetch_add(1);
              runs.fetch_add(1);
            });
          });
        }
        for (auto& th : pool) th.join();
        for (int64_t i = 0; i < items; ++i)
          ASSERT_EQ(seen[static_cast<size_t>(i)].load(), 1) << "item " << i << " of " << items << ", " << threads << " threads, absent " << absent;
        if (items >= 37 && threads == 1) {
          EXPECT_LT(runs.load(), items) << "one thread takes its stretch in runs, not item by item";
        }
      }
}

TEST(LinearForward, DecodingRowsTakeTheGemvAndABatchDecodesLikeEachSequenceAlone) {
  PolicyGuard guard;
  nn::set_kernel_policy({nn::KernelPath::Auto, nn::KernelPath::Auto, nn::KernelPath::Ours});
  at::NoGradGuard no_grad;
  at::manual_seed(19);
  auto w = at::randn({300, 96}), b = at::randn({300});
  // One new token for each of as many sequences as the GEMV takes (a server's step of decodes).
  auto x = at::randn({nn::kGemvMaxRows, 1, 96});
  auto y = nn::linear_forward(x, w, b);
  EXPECT_LT(max_abs_diff(y, at::linear(x.to(at::kDouble), w.to(at::kDouble), b.to(at::kDouble))), 1e-4);
  for (int64_t i = 0; i < nn::kGemvMaxRows; ++i)
    EXPECT_TRUE(at::equal(nn::linear_forward(x.narrow(0, i, 1), w, b), y.narrow(0, i, 1))) << "sequence " << i;
  // One more sequence takes ATen's GEMM.
  auto more = at::randn({nn::kGemvMaxRows + 1, 1, 96});
  EXPECT_TRUE(at::equal(nn::linear_forward(more, w, b), at::linear(more, w, b)));
  // A non-contiguous view of the last position (the LM head's input) gives the same bits.
  auto seq = at::randn({4, 5, 96});
  auto last = seq.narrow(1, 4, 1);
  EXPECT_TRUE(at::equal(nn::linear_forward(last, w), nn::linear_forward(last.contiguous(), w)));
  // Training shapes keep ATen's path (gradients recorded), and so do prefill shapes.
  nn::set_kernel_policy({nn::KernelPath::Auto, nn::KernelPath::Auto, nn::KernelPath::Aten});
  EXPECT_TRUE(at::equal(nn::linear_forward(x, w, b), at::linear(x, w, b)));
}

TEST(LinearForward, PrefillRowsTakeOurGemmOnlyWhereTheInferencePolicyAllowsIt) {
  PolicyGuard guard;
  at::NoGradGuard no_grad;
  at::manual_seed(23);
  auto w = at::randn({320, 96}), b = at::randn({320});   // widths the GEMM takes whole
  auto x = at::randn({3, 7, 96});                         // a prefill of 3 prompts
  auto ours = at::empty({21, 320});
  kernels::gemm({.rows = 21, .cols = 320, .depth = 96, .a = x.const_data_ptr<float>(), .a_row = 96, .a_depth = 1,
                 .b = w.const_data_ptr<float>(), .b_depth = 1, .b_col = 96, .c = ours.mutable_data_ptr<float>(), .ldc = 320,
                 .bias = b.const_data_ptr<float>()});
  // The default (one-shot infer): ATen's, untimed.
  nn::set_kernel_policy({});
  EXPECT_TRUE(at::equal(nn::linear_forward(x, w, b), at::linear(x, w, b)));
  EXPECT_TRUE(nn::kernel_choices().empty());
  // A server's (Auto): timed once per power of two of rows, then either side's bits.
  nn::KernelPolicy serving;
  serving.inference_gemm = nn::KernelPath::Auto;
  nn::set_kernel_policy(serving);
  auto y = nn::linear_forward(x, w, b);
  ASSERT_EQ(nn::kernel_choices().count("gemm fwd rows=32 in=96 out=320"), 1u);
  EXPECT_TRUE(at::equal(y.view({21, 320}), ours) || at::equal(y, at::linear(x, w, b)));
  nn::linear_forward(at::randn({5, 5, 96}), w, b);
  EXPECT_EQ(nn::kernel_choices().size(), 1u) << "25 rows share the choice of 21";
  // Forced: ours.
  serving.inference_gemm = nn::KernelPath::Ours;
  nn::set_kernel_policy(serving);
  EXPECT_TRUE(at::equal(nn::linear_forward(x, w, b).view({21, 320}), ours));
}
