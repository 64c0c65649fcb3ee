// Weight-only quantization: the int8/int4 decoding GEMV against double precision over the dequantized
// weight on every instruction set, the int4 packing as qgemv.h specifies it, the round-trip error
// bound, quantized models of each decoder family against the fp32 model (logits within a stated
// tolerance; exactly an fp32 model holding the dequantized weights), and the config's refusals.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <map>
#include <numeric>
#include <ATen/core/grad_mode.h>

#include "kernels/cpu/decode_block.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/qgemm.h"
#include "kernels/cpu/qgemv.h"
#include "models/registry.h"
#include "src/core/error.h"
#include "src/nn/causal_lm.h"
#include "src/nn/kernel_choice.h"
#include "src/engine/checkpoint.h"
#include "src/engine/generation_checkpoint.h"
#include "src/quant/calibration.h"
#include "src/quant/quantize_model.h"
#include "src/quant/quantized_linear.h"
#include "src/quant/quantized_weight.h"
#include "support/test_support.h"
#include "tests/support/quantized_models.h"

using namespace colossal;
using colossal::kernels::Isa;
using colossal::test::error_of;
using colossal::test::prefill_then_decode;
using colossal::test::quantized_pair;
using colossal::test::tiny_family;

namespace {

// y = x Wq^T + b through the decoding GEMV of `c`'s scheme, or the prompt GEMM (qgemm.h) where this CPU has it.
at::Tensor run_quantized(const at::Tensor& x, const quant::QuantizedWeight& q, const quant::QuantConfig& c, int64_t in,
                         const at::Tensor& bias, bool prompt_gemm) {
  const int64_t rows = x.size(0), out = q.q.size(0);
  auto y = at::empty({rows, out});
  const float* b = bias.defined() ? bias.const_data_ptr<float>() : nullptr;
  if (c.scheme == quant::Scheme::int4_weight)
    (prompt_gemm ? kernels::qgemm_int4 : kernels::qgemv_int4)(x.const_data_ptr<float>(), rows, in, q.q.const_data_ptr<uint8_t>(),
                                                              q.scales.const_data_ptr<float>(), c.group_for(in), b, y.mutable_data_ptr<float>(), out);
  else
    (prompt_gemm ? kernels::qgemm_int8 : kernels::qgemv_int8)(x.const_data_ptr<float>(), rows, in, q.q.const_data_ptr<int8_t>(),
                                                              q.scales.const_data_ptr<float>(), c.group_for(in), b, y.mutable_data_ptr<float>(), out);
  return y;
}
at::Tensor run_qgemv(const at::Tensor& x, const quant::QuantizedWeight& q, const quant::QuantConfig& c, int64_t in, const at::Tensor& bias) {
  return run_quantized(x, q, c, in, bias, false);
}
at::Tensor run_qgemm(const at::Tensor& x, const quant::QuantizedWeight& q, const quant::QuantConfig& c, int64_t in, const at::Tensor& bias) {
  return run_quantized(x, q, c, in, bias, true);
}

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) { return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>(); }

// x [rows, in] quantized per block of 32 by the kernels: int8 values and scales.
std::pair<at::Tensor, at::Tensor> q8_rows(const at::Tensor& x) {
  const int64_t rows = x.size(0), in = x.size(1);
  auto xq = at::empty({rows, in}, at::kChar);
  auto xs = at::empty({rows, in / kernels::kQ8Block});
  kernels::quantize_rows_q8(x.const_data_ptr<float>(), rows, in, xq.mutable_data_ptr<int8_t>(), xs.mutable_data_ptr<float>());
  return {xq, xs};
}

// The x a layer of `in` inputs computes with: its int8 blocks dequantized on the integer path, else x.
at::Tensor x_as_computed(const at::Tensor& x, int64_t in, const quant::QuantConfig& c) {
  if (!kernels::qgemv_integer_path(in, c.group_for(in))) return x;
  auto [xq, xs] = q8_rows(x);
  return (xq.to(at::kFloat).view({x.size(0), -1, kernels::kQ8Block}) * xs.unsqueeze(-1)).view(x.sizes());
}

}  // namespace

TEST(QuantKernels, Int8AndInt4GemvMatchDoublePrecisionOverTheDequantizedWeightOnEveryInstructionSet) {
  at::manual_seed(21);
  struct Case {
    quant::Scheme scheme;
    int64_t in, group;
  };
  // int8 per channel at widths with vector and scalar tails; int8 and int4 in groups of 32 and 64.
  const Case cases[] = {{quant::Scheme::int8_weight, 1, 0},   {quant::Scheme::int8_weight, 7, 0},
                        {quant::Scheme::int8_weight, 100, 0}, {quant::Scheme::int8_weight, 768, 0},
                        {quant::Scheme::int8_weight, 96, 32}, {quant::Scheme::int8_weight, 768, 64},
                        {quant::Scheme::int4_weight, 32, 32}, {quant::Scheme::int4_weight, 96, 32},
                        {quant::Scheme::int4_weight, 768, 64}, {quant::Scheme::int4_weight, 256, 128}};
  for (Isa isa : kernels::runnable_isas()) {
    kernels::ScopedIsa cap(isa);
    for (const auto& k : cases)
      for (int64_t rows : {1, 2, 3, 4, 5, 8})
        for (int64_t out : {1, 5, 33, 300})
          for (bool bias : {false, true}) {
            const quant::QuantConfig c{k.scheme, k.group};
            auto w = at::randn({out, k.in}), x = at::randn({rows, k.in});
            auto b = bias ? at::randn({out}) : at::Tensor();
            const auto q = quant::quantize_weight(w, c);
            auto ref = at::mm(x_as_computed(x, k.in, c).to(at::kDouble), quant::dequantize_weight(q.q, q.scales, c, k.in).to(at::kDouble).t());
            if (bias) ref += b.to(at::kDouble);
            EXPECT_LT(max_abs_diff(run_qgemv(x, q, c, k.in, b), ref), 3e-6 * k.in + 1e-5)
                << kernels::isa_name(isa) << " " << quant::scheme_name(k.scheme) << " in=" << k.in << " group=" << k.group
                << " rows=" << rows << " out=" << out << " bias=" << bias;
          }
  }
}

TEST(QuantKernels, XRowsQuantizeToInt8PerBlockOf32AtAbsmaxOver127OnEveryInstructionSet) {
  at::manual_seed(25);
  auto x = at::randn({3, 96}) * 3;
  x.narrow(1, 32, 32).select(0, 1).zero_();   // an all-zero block: scale 0, values 0
  const auto absmax = x.view({3, 3, 32}).abs().amax(-1);
  for (Isa isa : kernels::runnable_isas()) {
    kernels::ScopedIsa cap(isa);
    auto [xq, xs] = q8_rows(x);
    EXPECT_TRUE(at::equal(xs, absmax / 127.0f)) << kernels::isa_name(isa);
    // x * (127 / absmax) rounded to nearest: within half a step (and a float's rounding) of x / scale.
    const auto exact = x.view({3, 3, 32}) / xs.unsqueeze(-1).clamp_min(1e-30);
    EXPECT_LE((xq.to(at::kFloat).view({3, 3, 32}) - exact).abs().max().item<float>(), 0.5f + 1e-4f) << kernels::isa_name(isa);
    EXPECT_EQ(xq.abs().max().item<int8_t>(), 127) << kernels::isa_name(isa);
    EXPECT_TRUE(xq.select(0, 1).narrow(0, 32, 32).eq(0).all().item<bool>()) << kernels::isa_name(isa);
    if (isa != kernels::runnable_isas().front()) {
      kernels::ScopedIsa base(kernels::runnable_isas().front());
      EXPECT_TRUE(at::equal(q8_rows(x).first, xq)) << kernels::isa_name(isa) << " quantizes x unlike the baseline";
    }
  }
}

TEST(QuantKernels, AQuantizedRowGetsTheSameBitsAloneInABatchOrOnAnyThreadCount) {
  at::manual_seed(22);
  const int64_t in = 320, out = 1003;   // 10 int4 blocks; an output count that splits unevenly
  auto x = at::randn({6, in}), w = at::randn({out, in}), b = at::randn({out});
  for (const quant::QuantConfig c : {quant::QuantConfig{quant::Scheme::int8_weight, 0}, quant::QuantConfig{quant::Scheme::int8_weight, 64},
                                     quant::QuantConfig{quant::Scheme::int4_weight, 32}}) {
    const auto q = quant::quantize_weight(w, c);
    for (Isa isa : kernels::runnable_isas()) {
      kernels::ScopedIsa cap(isa);
      auto together = run_qgemv(x, q, c, in, b);
      for (int64_t r = 0; r < 6; ++r)
        EXPECT_TRUE(at::equal(run_qgemv(x.narrow(0, r, 1).contiguous(), q, c, in, b), together.narrow(0, r, 1)))
            << kernels::isa_name(isa) << " " << quant::scheme_name(c.scheme) << " row " << r;
      const int threads = at::get_num_threads();
      at::set_num_threads(1);
      auto single_thread = run_qgemv(x, q, c, in, b);
      at::set_num_threads(threads);
      EXPECT_TRUE(at::equal(single_thread, together)) << kernels::isa_name(isa) << " " << quant::scheme_name(c.scheme);
    }
  }
}

TEST(QuantKernels, TheVnniDotProductsGiveTheAvx512CopysBits) {
  if (kernels::machine_isa() < Isa::avx512vnni) GTEST_SKIP() << "this CPU has no AVX-512 VNNI";
  at::manual_seed(23);
  const int64_t in = 768, out = 131;
  auto w = at::randn({out, in}), b = at::randn({out});
  // int8 per channel and per group, int4 per group; 1 to 9 rows cover every tile shape and the tails.
  for (const quant::QuantConfig c : {quant::QuantConfig{quant::Scheme::int8_weight, 0}, quant::QuantConfig{quant::Scheme::int8_weight, 64},
                                     quant::QuantConfig{quant::Scheme::int4_weight, 128}}) {
    const auto q = quant::quantize_weight(w, c);
    for (int64_t rows : {1, 2, 3, 4, 5, 8, 9}) {
      auto x = at::randn({rows, in}) * 4;
      at::Tensor plain, vnni;
      {
        kernels::ScopedIsa cap(Isa::avx512);
        plain = run_qgemv(x, q, c, in, b);
      }
      {
        kernels::ScopedIsa cap(Isa::avx512vnni);
        vnni = run_qgemv(x, q, c, in, b);
      }
      EXPECT_TRUE(at::equal(vnni, plain)) << quant::scheme_name(c.scheme) << " group " << c.group << " rows " << rows
                                          << ": max difference " << (vnni - plain).abs().max().item<float>();
    }
  }
}

TEST(QuantKernels, ThePromptGemmMatchesDoublePrecisionOverTheRoundedXAndTheDequantizedWeight) {
  if (!kernels::qgemm_available(32, 32)) GTEST_SKIP() << "this CPU has no AVX2: prompts take the dequantizing GEMM";
  at::manual_seed(28);
  struct Case {
    quant::Scheme scheme;
    int64_t in, group;
  };
  // int8 per channel and in groups, int4 in groups; widths of one block and many, groups of one block and several.
  const Case cases[] = {{quant::Scheme::int8_weight, 32, 0},  {quant::Scheme::int8_weight, 96, 0},   {quant::Scheme::int8_weight, 768, 0},
                        {quant::Scheme::int8_weight, 96, 32}, {quant::Scheme::int8_weight, 768, 64}, {quant::Scheme::int4_weight, 96, 32},
                        {quant::Scheme::int4_weight, 256, 128}, {quant::Scheme::int4_weight, 768, 64}};
  for (const auto& k : cases)
    for (int64_t rows : {1, 5, 6, 7, 13, 14, 40})     // the 6-row passes and a last pass of up to 8
      for (int64_t out : {1, 5, 16, 33, 300})    // whole 16-column tiles and masked ones
        for (bool bias : {false, true}) {
          const quant::QuantConfig c{k.scheme, k.group};
          auto w = at::randn({out, k.in}), x = at::randn({rows, k.in}) * 3;
          auto b = bias ? at::randn({out}) : at::Tensor();
          const auto q = quant::quantize_weight(w, c);
          auto ref = at::mm(x_as_computed(x, k.in, c).to(at::kDouble), quant::dequantize_weight(q.q, q.scales, c, k.in).to(at::kDouble).t());
          if (bias) ref += b.to(at::kDouble);
          EXPECT_LT(max_abs_diff(run_qgemm(x, q, c, k.in, b), ref), 3e-6 * k.in + 1e-5)
              << quant::scheme_name(k.scheme) << " in=" << k.in << " group=" << k.group << " rows=" << rows << " out=" << out << " bias=" << bias;
        }
}

TEST(QuantKernels, APromptRowGetsTheSameBitsAloneInABatchOrOnAnyThreadCount) {
  if (!kernels::qgemm_available(32, 32)) GTEST_SKIP() << "this CPU has no AVX2: prompts take the dequantizing GEMM";
  at::manual_seed(29);
  const int64_t in = 320, out = 1003;   // an output count that splits unevenly into tiles and threads
  auto x = at::randn({19, in}), w = at::randn({out, in}), b = at::randn({out});
  for (const quant::QuantConfig c : {quant::QuantConfig{quant::Scheme::int8_weight, 0}, quant::QuantConfig{quant::Scheme::int8_weight, 64},
                                     quant::QuantConfig{quant::Scheme::int4_weight, 32}}) {
    const auto q = quant::quantize_weight(w, c);
    auto together = run_qgemm(x, q, c, in, b);
    for (int64_t r : {0, 5, 6, 18})
      EXPECT_TRUE(at::equal(run_qgemm(x.narrow(0, r, 1).contiguous(), q, c, in, b), together.narrow(0, r, 1)))
          << quant::scheme_name(c.scheme) << " row " << r;
    const int threads = at::get_num_threads();
    at::set_num_threads(1);
    auto single_thread = run_qgemm(x, q, c, in, b);
    at::set_num_threads(threads);
    EXPECT_TRUE(at::equal(single_thread, together)) << quant::scheme_name(c.scheme);
  }
}

// The weight-only configs the packed GEMM takes: int8 per channel and in groups, int4 in groups of one block and several.
const quant::QuantConfig kPackedConfigs[] = {{quant::Scheme::int8_weight, 0}, {quant::Scheme::int8_weight, 64},
                                             {quant::Scheme::int4_weight, 32}, {quant::Scheme::int4_weight, 128}};

at::Tensor run_packed(const at::Tensor& x, const quant::QuantizedWeight& packed, const quant::QuantConfig& c, int64_t in, int64_t out,
                      const at::Tensor& bias) {
  auto y = at::empty({x.size(0), out});
  kernels::qgemm_packed(x.const_data_ptr<float>(), x.size(0), in, packed.q.const_data_ptr<uint8_t>(), packed.scales.const_data_ptr<float>(),
                        c.scheme == quant::Scheme::int4_weight, c.group_for(in), bias.defined() ? bias.const_data_ptr<float>() : nullptr,
                        y.mutable_data_ptr<float>(), out);
  return y;
}

// SmoothQuant's prompt path as ATen's ops compute it (QuantizedLinear::smoothquant_gemm on a GPU): x / s,
// quantized per row at absmax / 127, the int8 GEMM's int32 sums, then the row's scale, the column's scale
// and the bias. The sums exactly, in double: at::_int_mm gives them where the CPU has VNNI, but without
// it oneDNN adds byte products in int16 pairs that saturate (why the CPU never takes it).
at::Tensor w8a8_by_aten(const at::Tensor& x, const at::Tensor& smooth, const at::Tensor& w, const at::Tensor& sw, const at::Tensor& bias) {
  const auto xs = smooth.defined() ? x / smooth : x;
  const auto sx = xs.abs().amax(1, /*keepdim=*/true) / 127.0f;
  const auto xq = (xs / at::where(sx > 0, sx, at::ones_like(sx))).round_().clamp_(-127, 127).to(at::kChar);
  const auto sums = at::mm(xq.to(at::kDouble), w.to(at::kDouble).t()).to(at::kInt);
  auto y = sums.to(at::kFloat).mul_(sx).mul_(sw.view({1, -1}));
  if (bias.defined()) y.add_(bias);
  return y;
}

TEST(QuantKernels, TheW8a8GemmGivesAtensPathsBitsWithExactIntegerSumsOnEverySet) {
  at::manual_seed(34);
  for (int64_t in : {64, 96, 768})   // whole 64-input tile steps, and a last 32
    for (int64_t rows : {1, 5, 16, 17, 40, 100})   // (100 x 768: the rows quantized on every thread)
      for (int64_t out : {5, 16, 40})
        for (bool with_bias : {false, true}) {
          auto x = at::randn({rows, in}) * 3;
          if (rows > 3) x.select(0, 3).zero_();   // a zero row: scale 0, divided by 1 instead
          if (rows > 4) x.select(0, 4).fill_(2.5f);   // a constant row: each value its absmax, 127 after the divisions
          const auto smooth = with_bias ? at::rand({in}) + 0.25f : at::Tensor();   // with and without SmoothQuant's s
          const auto w = at::randint(-127, 128, {out, in}).to(at::kChar);
          const auto sw = at::rand({out}) * 0.02f + 1e-3f;
          const auto b = with_bias ? at::randn({out}) : at::Tensor();
          const auto ref = w8a8_by_aten(x, smooth, w, sw, b);
          const auto packed = quant::pack_for_qgemm({w, sw.view({out, 1})}, quant::QuantConfig{quant::Scheme::int8_weight, 0}, in);
          const std::string what = "in=" + std::to_string(in) + " rows=" + std::to_string(rows) + " out=" + std::to_string(out) +
                                   (with_bias ? " bias and s" : "");
          for (Isa isa : kernels::runnable_isas()) {   // the scalar loop in the baseline set
            kernels::ScopedIsa cap(isa);
            auto y = at::empty({rows, out});
            kernels::qgemm_w8a8(x.const_data_ptr<float>(), smooth.defined() ? smooth.const_data_ptr<float>() : nullptr, rows, in,
                                packed.q.const_data_ptr<uint8_t>(), packed.scales.const_data_ptr<float>(),
                                with_bias ? b.const_data_ptr<float>() : nullptr, y.mutable_data_ptr<float>(), out);
            EXPECT_TRUE(at::equal(y.view(at::kInt), ref.view(at::kInt))) << what << " on " << kernels::isa_name(isa) << ": max difference "
                                                                      << max_abs_diff(y, ref);
          }
        }
}

TEST(QuantKernels, AmxTilesGiveTheVnniLoopsBitsForPromptsPackedPerCallOrAtLoad) {
  if (kernels::machine_isa() < Isa::amx) GTEST_SKIP() << "this CPU (or its kernel) gives no AMX int8 tiles: prompts take the VNNI loop";
  at::manual_seed(33);
  struct Case {
    quant::Scheme scheme;
    int64_t in, group;
  };
  // int8 per channel (an odd block count: a pair's second tile unused at the end) and in groups of one
  // block and several; int4 in groups of one block and of 128.
  const Case cases[] = {{quant::Scheme::int8_weight, 96, 0},  {quant::Scheme::int8_weight, 768, 0},   {quant::Scheme::int8_weight, 256, 32},
                        {quant::Scheme::int8_weight, 768, 64}, {quant::Scheme::int4_weight, 96, 32}, {quant::Scheme::int4_weight, 768, 128}};
  const int threads = at::get_num_threads();
  for (const auto& k : cases)
    for (int64_t rows : {16, 17, 22, 32, 53})   // whole 16-row tiles, and the VNNI loop's 6-row tiles after them
      for (int64_t out : {5, 16, 40, 300}) {
        const quant::QuantConfig c{k.scheme, k.group};
        auto x = at::randn({rows, k.in}) * 3, b = at::randn({out});
        x.select(0, 3).zero_();   // a row of zeros: x scales of 0
        const auto q = quant::quantize_weight(at::randn({out, k.in}), c);
        const auto packed = quant::pack_for_qgemm(q, c, k.in);
        const std::string what = std::string(quant::scheme_name(c.scheme)) + " in=" + std::to_string(k.in) + " g=" + std::to_string(k.group) +
                                 " rows=" + std::to_string(rows) + " out=" + std::to_string(out);
        at::Tensor vnni, vnni_packed;
        {
          kernels::ScopedIsa cap(Isa::avx512vnni);
          vnni = run_qgemm(x, q, c, k.in, b);
          vnni_packed = run_packed(x, packed, c, k.in, out, b);
        }
        kernels::ScopedIsa cap(Isa::amx);
        for (int t : {threads, 1}) {
          at::set_num_threads(t);
          EXPECT_TRUE(at::equal(run_qgemm(x, q, c, k.in, b), vnni)) << what << " packed per call, threads " << t;
          EXPECT_TRUE(at::equal(run_packed(x, packed, c, k.in, out, b), vnni_packed)) << what << " packed at load, threads " << t;
        }
        at::set_num_threads(threads);
        EXPECT_TRUE(at::equal(vnni_packed, vnni)) << what;
      }
}


TEST(QuantKernels, PackingForTheGemmAndBackIsExactAndTheLastTilesSpareColumnsAreZeroWeights) {
  at::manual_seed(30);
  for (const quant::QuantConfig& c : kPackedConfigs)
    for (int64_t out : {1, 16, 21, 50})
      for (int64_t in : {128, 256}) {
        const auto q = quant::quantize_weight(at::randn({out, in}), c);
        const auto packed = quant::pack_for_qgemm(q, c, in);
        const int64_t tiles = (out + 15) / 16;
        const std::string what = std::string(quant::scheme_name(c.scheme)) + " g=" + std::to_string(c.group) + " out=" + std::to_string(out);
        for (Isa isa : kernels::runnable_isas()) {   // the scalar loop in the baseline set, else the set's own packer
          kernels::ScopedIsa cap(isa);
          const auto again = quant::pack_for_qgemm(q, c, in);
          EXPECT_TRUE(at::equal(again.q, packed.q) && at::equal(again.scales, packed.scales)) << what << " on " << kernels::isa_name(isa);
        }
        ASSERT_EQ(packed.q.sizes(), (std::vector<int64_t>{tiles, in * 16 / (c.bits() == 4 ? 2 : 1)})) << what;
        ASSERT_EQ(packed.scales.sizes(), (std::vector<int64_t>{tiles, in / c.group_for(in) * 16})) << what;
        const auto back = quant::unpack_from_qgemm(packed, c, in, out);
        EXPECT_TRUE(at::equal(back.q, q.q)) << what;
        EXPECT_TRUE(at::equal(back.scales, q.scales)) << what;
        // Every output row, the spare ones included, read back from the panels as the dequantized weight (exactly).
        std::vector<int64_t> ids(static_cast<size_t>(tiles * 16));
        std::iota(ids.begin(), ids.end(), 0);
        auto rows = at::empty({tiles * 16, in});
        kernels::qgemm_packed_rows(packed.q.const_data_ptr<uint8_t>(), packed.scales.const_data_ptr<float>(), c.bits() == 4, c.group_for(in), in,
                                   ids.data(), tiles * 16, rows.mutable_data_ptr<float>());
        EXPECT_TRUE(at::equal(rows.narrow(0, 0, out), quant::dequantize_weight(q.q, q.scales, c, in))) << what;
        EXPECT_TRUE(at::equal(rows.narrow(0, out, tiles * 16 - out), at::zeros({tiles * 16 - out, in}))) << what;
        EXPECT_TRUE(at::equal(packed.scales.view({tiles, -1, 16}).select(0, tiles - 1).narrow(1, (out - 1) % 16 + 1, 15 - (out - 1) % 16),
                              at::zeros({in / c.group_for(in), 15 - (out - 1) % 16})))
            << what;
      }
}

TEST(QuantKernels, ThePackedGemmGivesTheScalarLoopsBitsOnEverySetAndThePerCallPackingsWithVnni) {
  at::manual_seed(31);
  const int64_t in = 256;
  for (const quant::QuantConfig& c : kPackedConfigs)
    // a decoding step's few rows (with VNNI, qgemm_step_rows' layout over two tiles at a time), the 6-row passes and a last
    // pass of up to 8 (13 = 6 + 7, 14 = 6 + 8); AMX's 16-row tiles; without VNNI, groups of 2 (int8) or 4 (int4) rows, 8 groups
    // to a block, and their remainders
    for (int64_t rows : {1, 2, 3, 6, 8, 13, 14, 16, 37})
      for (int64_t out : {5, 16, 29, 40}) {   // a tile's first half partial; both halves, the second partial; a first half alone
        auto x = at::randn({rows, in}) * 2, b = at::randn({out});
        const auto q = quant::quantize_weight(at::randn({out, in}), c);
        const auto packed = quant::pack_for_qgemm(q, c, in);
        const std::string what = std::string(quant::scheme_name(c.scheme)) + " g=" + std::to_string(c.group) + " rows=" +
                                 std::to_string(rows) + " out=" + std::to_string(out);
        at::Tensor first;
        for (Isa isa : kernels::runnable_isas()) {   // in the baseline set, the scalar loop
          kernels::ScopedIsa cap(isa);
          const auto y = run_packed(x, packed, c, in, out, b);
          if (!first.defined()) {
            first = y;
            auto ref = at::mm(x_as_computed(x, in, c).to(at::kDouble), quant::dequantize_weight(q.q, q.scales, c, in).to(at::kDouble).t());
            EXPECT_LT(max_abs_diff(y, ref + b.to(at::kDouble)), 3e-6 * in + 1e-5) << what;
          }
          EXPECT_TRUE(at::equal(y, first)) << what << " on " << kernels::isa_name(isa);
          if (kernels::qgemm_available(in, c.group_for(in))) {
            EXPECT_TRUE(at::equal(y, run_qgemm(x, q, c, in, b))) << what << ": packed once against packed per call";
          }
        }
      }
}


// The weights and x values at the ends of their ranges, where a byte multiply that adds pairs of products
// in int16 (AVX2's, in the avx2 and avx512 sets) would saturate if a block's products were not split small
// enough: every int8 byte (-128, which our quantizer never writes, included), int4's nibbles 0 and 15,
// and x rows whose every value quantizes to +127 or -127. Every set gives the scalar loop's bits.
TEST(QuantKernels, ThePackedGemmsIntegerSumsAreExactAtTheEndsOfTheByteRanges) {
  const int64_t in = 256, out = 32;
  auto x = at::ones({6, in});
  x.select(0, 1).fill_(-3.0f);
  x.select(0, 2).narrow(0, 0, in / 2).fill_(-1.0f);                                     // +127 then -127 in each row
  x.select(0, 3).copy_(at::arange(in).remainder(2).mul(2).sub(1).to(at::kFloat));       // alternating signs
  x.select(0, 4).copy_(at::arange(in).to(at::kFloat).sub(in / 2));                      // every value from -127 to 127
  x.select(0, 5).zero_();
  for (int scheme = 0; scheme < 3; ++scheme) {
    quant::QuantizedWeight q;
    quant::QuantConfig c{scheme < 2 ? quant::Scheme::int8_weight : quant::Scheme::int4_weight, scheme == 1 ? 64 : 0};
    if (scheme == 2) c.group = 128;
    if (c.scheme == quant::Scheme::int8_weight) {
      auto bytes = at::empty({out, in}, at::kChar);
      bytes.narrow(0, 0, 8).fill_(127), bytes.narrow(0, 8, 8).fill_(-127), bytes.narrow(0, 16, 8).fill_(-128);
      bytes.narrow(0, 24, 8).copy_(at::arange(8 * in).remainder(256).sub(128).to(at::kChar).view({8, in}));   // every byte
      q = {bytes, at::full({out, in / c.group_for(in)}, 0.02f)};
    } else {
      auto bytes = at::empty({out, in / 2}, at::kByte);
      bytes.narrow(0, 0, 8).fill_(0xFF), bytes.narrow(0, 8, 8).fill_(0x00), bytes.narrow(0, 16, 8).fill_(0xF0);
      bytes.narrow(0, 24, 8).copy_(at::arange(8 * in / 2).remainder(256).to(at::kByte).view({8, in / 2}));
      q = {bytes, at::full({out, in / c.group_for(in)}, 0.5f)};
    }
    const auto packed = quant::pack_for_qgemm(q, c, in);
    const auto b = at::randn({out});
    at::Tensor first;
    for (Isa isa : kernels::runnable_isas()) {
      kernels::ScopedIsa cap(isa);
      const auto y = run_packed(x, packed, c, in, out, b);
      if (!first.defined()) {
        first = y;
        auto ref = at::mm(x_as_computed(x, in, c).to(at::kDouble), quant::dequantize_weight(q.q, q.scales, c, in).to(at::kDouble).t());
        ref += b.to(at::kDouble);
        EXPECT_LT(max_abs_diff(y, ref), 1e-6 * ref.abs().max().item<double>() + 1e-5) << quant::scheme_name(c.scheme) << " g=" << c.group;
      }
      EXPECT_TRUE(at::equal(y, first)) << quant::scheme_name(c.scheme) << " g=" << c.group << " on " << kernels::isa_name(isa)
                                       << ": max difference " << max_abs_diff(y, first);
    }
  }
}
// Every set's packed GEMM gives the same bits at every row count up to two of the largest row groups
// and a tail (the byte-multiply copy's groups are 2 and 4 rows in 256-bit vectors, 4 and 8 in 512-bit
// ones; VNNI's passes 6 and up to 8) and at whole, half and masked tiles.
TEST(QuantKernels, ThePackedGemmGivesEverySetTheSameBitsForEveryRowCountAndTileWidth) {
  at::manual_seed(35);
  const int64_t in = 256;
  for (const auto& c : kPackedConfigs)
    for (int64_t out : {5, 16, 24, 37}) {
      const auto w = at::randn({out, in}), b = at::randn({out});
      const auto packed = quant::pack_for_qgemm(quant::quantize_weight(w, c), c, in);
      for (int64_t rows = 1; rows <= 17; ++rows) {
        const auto x = at::randn({rows, in}) * 3;
        at::Tensor first;
        for (Isa isa : kernels::runnable_isas()) {
          kernels::ScopedIsa cap(isa);
          const auto y = run_packed(x, packed, c, in, out, b);
          if (!first.defined()) first = y;
          EXPECT_TRUE(at::equal(y, first)) << quant::scheme_name(c.scheme) << " g=" << c.group << " out=" << out << " rows=" << rows
                                           << " on " << kernels::isa_name(isa) << ": max difference " << max_abs_diff(y, first);
        }
      }
    }
}

TEST(QuantizeWeight, Int4PacksInputJAndJPlus16OfEachBlockIntoByteJ) {
  // One row of 32 inputs with the values -7..7 spread so that scale = 1 (absmax 7).
  auto w = at::empty({1, 32});
  for (int64_t i = 0; i < 32; ++i) w[0][i] = static_cast<float>(i % 15 - 7);
  const quant::QuantConfig c{quant::Scheme::int4_weight, 32};
  const auto q = quant::quantize_weight(w, c);
  ASSERT_EQ(q.q.sizes(), (at::IntArrayRef{1, 16}));
  EXPECT_FLOAT_EQ(q.scales[0][0].item<float>(), 1.0f);
  for (int64_t j = 0; j < 16; ++j) {
    const int lo = j % 15 - 7 + 8, hi = (j + 16) % 15 - 7 + 8;
    EXPECT_EQ(q.q[0][j].item<uint8_t>(), static_cast<uint8_t>(lo | (hi << 4))) << "byte " << j;
  }
  EXPECT_TRUE(at::equal(quant::dequantize_weight(q.q, q.scales, c, 32), w));
}

// The CPU's one pass gives the ATen operations' bits: ties to even (values exactly half a step from two
// integers), groups of zeros, the clamp at the range's ends, non-contiguous and double input, uneven row
// counts across threads.
TEST(QuantizeWeight, TheOnePassQuantizerGivesTheAtenReferencesBits) {
  at::manual_seed(24);
  auto w = at::randn({37, 256});
  w.narrow(0, 5, 1).zero_();
  // Rows whose groups' scale is exactly 1 (absmax 127 for int8, 7 for int4) and whose other values lie
  // halfway between integers: every one a tie.
  const auto halves = (at::arange(256) % 8).to(at::kFloat) - 3.5f;
  w[7] = halves.index_fill(0, at::arange(0, 256, 32), 127.0f);
  w[8] = halves.index_fill(0, at::arange(0, 256, 32), 7.0f);
  w[9] = at::arange(256).to(at::kFloat) - 127.5f;
  for (const quant::QuantConfig c : {quant::QuantConfig{quant::Scheme::int8_weight, 0}, quant::QuantConfig{quant::Scheme::int8_weight, 32},
                                     quant::QuantConfig{quant::Scheme::int4_weight, 32}, quant::QuantConfig{quant::Scheme::int4_weight, 128}}) {
    // Rows, a transposed view (GPT-2's Conv1D weights as the file holds them; 37 rows: a partial block
    // of 16), another layout and another precision.
    for (const auto& input : {w, w.t().contiguous().t(), at::cat({w, w.narrow(0, 0, 13)}).t().contiguous().t().narrow(0, 0, 37), w.to(at::kDouble)}) {
      const auto fast = quant::quantize_weight(input, c), ref = quant::quantize_weight_reference(input, c);
      EXPECT_TRUE(at::equal(fast.q, ref.q)) << quant::scheme_name(c.scheme) << " g=" << c.group;
      EXPECT_TRUE(at::equal(fast.scales, ref.scales)) << quant::scheme_name(c.scheme) << " g=" << c.group;
    }
  }
}

TEST(QuantizeWeight, EveryWeightRoundTripsWithinHalfItsGroupsScaleAndZeroGroupsStayZero) {
  at::manual_seed(23);
  auto w = at::randn({64, 256});
  w.narrow(0, 3, 1).zero_();   // a row (so every group of it) of zeros
  for (const quant::QuantConfig c : {quant::QuantConfig{quant::Scheme::int8_weight, 0}, quant::QuantConfig{quant::Scheme::int8_weight, 32},
                                     quant::QuantConfig{quant::Scheme::int4_weight, 32}, quant::QuantConfig{quant::Scheme::int4_weight, 128}}) {
    const auto q = quant::quantize_weight(w, c);
    EXPECT_EQ(q.q.scalar_type(), c.scheme == quant::Scheme::int4_weight ? at::kByte : at::kChar);
    EXPECT_EQ(q.scales.sizes(), (at::IntArrayRef{64, 256 / c.group_for(256)}));
    const auto back = quant::dequantize_weight(q.q, q.scales, c, 256);
    const auto per_weight_scale = q.scales.repeat_interleave(c.group_for(256), 1);   // [64, 256]
    EXPECT_TRUE(((back - w).abs() <= per_weight_scale * 0.5 + 1e-7).all().item<bool>()) << quant::scheme_name(c.scheme) << " g=" << c.group;
    EXPECT_TRUE(at::equal(back.narrow(0, 3, 1), w.narrow(0, 3, 1))) << quant::scheme_name(c.scheme);
  }
}


TEST(QuantizedModel, EachFamilysLogitsStayNearFp32AndTheDequantizedModelsInPrefillAndDecoding) {
  struct Tolerance {
    quant::QuantConfig config;
    double of_logit_std;   // RMS(logits - fp32 logits) / std(fp32 logits)
  };
  // Stated tolerances at these shapes (random N(0, 0.02) weights, 64 wide, 2 blocks): the RMS error of the
  // logits is at most 2% of their spread with int8, 3% with SmoothQuant's W8A8 and 25% with int4 in groups
  // of 32 (measured: int8 0.03-1.0%, int4 0.4-15%, OPT the largest).
  const Tolerance cases[] = {{{quant::Scheme::int8_weight, 0}, 0.02}, {{quant::Scheme::int8_weight, 32}, 0.02},
                             {{quant::Scheme::int4_weight, 32}, 0.25}, {{quant::Scheme::int8_smoothquant, 0}, 0.03}};
  for (Isa isa : kernels::runnable_isas())
  for (const std::string family : {"gpt", "opt", "bloom"})
    for (const auto& t : cases) {
      kernels::ScopedIsa cap(isa);
      const auto m = quantized_pair(family, t.config);
      at::NoGradGuard no_grad;
      const auto ids = at::randint(0, 96, {2, 12}, at::kLong);
      const auto ref = m.fp32->forward(ids), deq = m.dequantized->forward(ids);
      // Prefill (the dequantized GEMM), then one token at a time through the cache (the quantized GEMV).
      auto cache = m.quantized->make_cache(2, 12, c10::Device(c10::kCPU));
      nn::ForwardOptions o;
      o.cache = &cache;
      std::vector<at::Tensor> steps{m.quantized->forward(ids.narrow(1, 0, 8), o)};
      for (int64_t s = 8; s < 12; ++s) steps.push_back(m.quantized->forward(ids.narrow(1, s, 1), o));
      const auto got = at::cat(steps, 1);   // [2, 12, V]
      const std::string what = std::string(kernels::isa_name(isa)) + " " + family + " " + quant::scheme_name(t.config.scheme) +
                               " g=" + std::to_string(t.config.group);
      // The prefill's 16 rows are a short prompt: the integer GEMM where the CPU has AVX2, the decoding GEMV
      // elsewhere, both with x rounded as decoding rounds it (SmoothQuant: x rounded to int8 per token, RMS
      // within 1.5% of the logits' spread; measured 0.03-0.9%); the decoding steps' integer path with x
      // rounded to int8 per block of 32 (RMS within 1%). A longer prefill computes exactly with the
      // dequantized weights where the CPU has no integer GEMM (below).
      const double prefill_rel = (got.narrow(1, 0, 8) - deq.narrow(1, 0, 8)).pow(2).mean().sqrt().item<double>() / deq.std().item<double>();
      if (t.config.scheme != quant::Scheme::int8_smoothquant) {
        EXPECT_LT(prefill_rel, 0.01) << what;
        EXPECT_GT(prefill_rel, 0.0) << what << ": the integer kernel computed with float activations";
      } else {
        EXPECT_LT(prefill_rel, 0.015) << what;
        EXPECT_GT(prefill_rel, 0.0) << what << ": the W8A8 GEMM computed with float activations";
      }
      if (t.config.scheme != quant::Scheme::int8_smoothquant && !kernels::qgemm_available(64, t.config.group_for(64))) {
        const auto long_ids = at::randint(0, 96, {2, 20}, at::kLong);   // 40 rows
        EXPECT_LT(max_abs_diff(m.quantized->forward(long_ids), m.dequantized->forward(long_ids)),
                  1e-4 * deq.abs().max().item<double>() + 1e-6) << what << ": a long prefill through the dequantizing GEMM";
      }
      const double decode_rel = (got.narrow(1, 8, 4) - deq.narrow(1, 8, 4)).pow(2).mean().sqrt().item<double>() / deq.std().item<double>();
      EXPECT_LT(decode_rel, 0.01) << what;
      const double rel = (got - ref).pow(2).mean().sqrt().item<double>() / ref.std().item<double>();
      EXPECT_LT(rel, t.of_logit_std) << what;
      EXPECT_GT(max_abs_diff(got, ref), 0.0) << what << ": the quantized model computed the fp32 one";
    }
}

TEST(QuantConfig, BadSchemesGroupsAndLayersAreRefusedWithWhatWouldBeValid) {
  EXPECT_EQ(error_of([] { quant::parse_scheme("int3-weight"); }),
            "unknown quantization scheme \"int3-weight\" (valid: int8-weight, int4-weight, int8-smoothquant)");
  EXPECT_NE(error_of([] { quant::check_group(quant::Scheme::int8_smoothquant, 128); }).find("drop --group-size"), std::string::npos);
  EXPECT_NE(error_of([] { quant::check_group(quant::Scheme::int4_weight, 0); }).find("positive multiple of 32"), std::string::npos);
  EXPECT_NE(error_of([] { quant::check_group(quant::Scheme::int4_weight, 48); }).find("try 32, 64 or 128"), std::string::npos);
  EXPECT_NE(error_of([] { quant::check_group(quant::Scheme::int8_weight, -1); }).find("negative"), std::string::npos);
  EXPECT_EQ(error_of([] { quant::check_group(quant::Scheme::int8_weight, 0); }), "(no error)");
  // A layer whose width the groups do not divide, named by its shape, before any weight is read.
  quant::QuantizedLayerFactory f({quant::Scheme::int4_weight, 128});
  EXPECT_NE(error_of([&] { build_model(tiny_family("gpt"), f, false); }).find("has 64 inputs, which groups of 128 do not divide"),
            std::string::npos);
  // config.json's entry: ours round-trips; another method's is refused by name.
  const quant::QuantConfig c{quant::Scheme::int4_weight, 64};
  const auto back = quant::quant_config_of({{"quantization_config", quant::to_json(c)}}, "m/config.json");
  ASSERT_TRUE(back);
  EXPECT_EQ(back->scheme, c.scheme);
  EXPECT_EQ(back->group, 64);
  EXPECT_TRUE(back->embedding) << "quantize writes the token embedding as int8 rows";
  // A directory written before the embedding was quantized says nothing of it: its embedding is fp32.
  auto older = quant::to_json(c);
  older.erase("embedding");
  EXPECT_FALSE(quant::quant_config_of({{"quantization_config", older}}, "m/config.json")->embedding);
  EXPECT_FALSE(quant::quant_config_of(nlohmann::json::object(), "m/config.json"));
  EXPECT_EQ(error_of([] { quant::quant_config_of({{"quantization_config", {{"quant_method", "gptq"}}}}, "m/config.json"); }),
            "m/config.json: quantization_config names quant_method \"gptq\"; colossal reads only its own (colossal quantize writes them)");
  EXPECT_NE(error_of([] {
              quant::quant_config_of({{"quantization_config", {{"quant_method", "colossal"}, {"scheme", "int4-weight"}, {"group_size", 40}}}},
                                     "m/config.json");
            }).find("m/config.json: quantization_config: int4-weight needs"),
            std::string::npos);
}

TEST(QuantizedModel, EachFamilyAndSchemeSavesAndLoadsBackBitForBit) {
  for (const std::string family : {"gpt", "opt", "bloom"})
    for (const quant::QuantConfig c : {quant::QuantConfig{quant::Scheme::int8_weight, 0}, quant::QuantConfig{quant::Scheme::int4_weight, 32},
                                       quant::QuantConfig{quant::Scheme::int8_smoothquant, 0}}) {
      const auto m = quantized_pair(family, c);
      test::TempDir dir;
      const TokenizerFiles tokenizer{{"tokenizer.model", test::read_file(test::small_corpus().tokenizer)}};
      save_model_dir(dir / "q", *m.quantized, tokenizer, nlohmann::json::object(), {{"quantization_config", quant::to_json(c)}});
      const auto opened = open_generation_checkpoint(dir / "q", "the test");
      ASSERT_TRUE(opened.quantized) << family;
      EXPECT_EQ(opened.quantized->scheme, c.scheme);
      const auto loaded = load_generation_model(opened, "the test", nullptr, /*pack_for_cpu=*/false);   // the checkpoint's layout
      std::map<std::string, at::Tensor> back;
      for (const auto& p : loaded->named_parameters()) back.emplace(p.key(), p.value());
      for (const auto& p : m.quantized->named_parameters()) {
        ASSERT_TRUE(back.count(p.key())) << p.key();
        EXPECT_TRUE(at::equal(back.at(p.key()), p.value())) << family << " " << quant::scheme_name(c.scheme) << " " << p.key();
      }
    }
}

TEST(QuantizedModel, PackedForTheCpuEachFamilyKeepsThePromptGemmsBitsAndEachSequenceGetsItsOwnBitsInAnyBatch) {
  if (!kernels::qgemm_available(32, 32)) GTEST_SKIP() << "this CPU has no AVX2: quantized layers are not packed";
  // SmoothQuant's prompts take qgemm_w8a8 over the panels packed at load, the plain layers' over panels packed per call.
  for (const std::string family : {"gpt", "opt", "bloom"})
    for (const quant::QuantConfig c : {quant::QuantConfig{quant::Scheme::int8_weight, 0}, quant::QuantConfig{quant::Scheme::int4_weight, 32},
                                       quant::QuantConfig{quant::Scheme::int8_smoothquant, 0}}) {
      const auto m = quantized_pair(family, c);
      test::TempDir dir;
      const TokenizerFiles tokenizer{{"tokenizer.model", test::read_file(test::small_corpus().tokenizer)}};
      save_model_dir(dir / "q", *m.quantized, tokenizer, nlohmann::json::object(), {{"quantization_config", quant::to_json(c)}});
      const auto opened = open_generation_checkpoint(dir / "q", "the test");
      const auto packed = load_generation_model(opened, "the test");
      const auto plain = load_generation_model(opened, "the test", nullptr, /*pack_for_cpu=*/false);
      const std::string what = family + " " + quant::scheme_name(c.scheme);
      int64_t panels = 0;   // every linear layer and the tied head hold panels: uint8 [tiles, bytes a tile]
      for (const auto& p : packed->named_parameters())
        if (p.key().ends_with("qweight")) {
          EXPECT_EQ(p.value().scalar_type(), at::kByte) << what << " " << p.key();
          ++panels;
        }
      EXPECT_GT(panels, 0) << what;
      at::NoGradGuard no_grad;
      const auto ids = at::randint(0, 96, {3, 12}, at::kLong);
      // A prompt takes the same kernel either way (packed per call or once): the same bits.
      EXPECT_TRUE(at::equal(packed->forward(ids), plain->forward(ids))) << what;
      // Decoding: each sequence alone gets the bits it gets in the batch (with the other kernels fixed, not
      // timed per shape); the unpacked GEMV rounds x alike and sums the same integers, its floats in
      // another order.
      const nn::KernelPath ours = nn::KernelPath::Ours;
      nn::set_kernel_policy({ours, ours, ours, ours, ours, ours});
      struct Reset {
        ~Reset() { nn::set_kernel_policy({}); }
      } reset;
      const auto together = prefill_then_decode(*packed, ids);
      for (int64_t b = 0; b < 3; ++b)
        EXPECT_TRUE(at::equal(prefill_then_decode(*packed, ids.narrow(0, b, 1)), together.narrow(0, b, 1))) << what << " sequence " << b;
      const auto gemv = prefill_then_decode(*plain, ids);
      EXPECT_LT(max_abs_diff(together, gemv), 1e-4 * gemv.abs().max().item<double>()) << what;
      // Where the kernel does not apply (a gradient to record), the panels are read back into the
      // checkpoint's layout: the float path over the dequantized weights.
      at::AutoGradMode grad(true);
      const auto deq = m.dequantized->forward(ids);
      EXPECT_LT(max_abs_diff(packed->forward(ids), deq), 1e-4 * deq.abs().max().item<double>() + 1e-6) << what;
    }
}

TEST(QuantKernels, GemmPackingAQuantizedWeightMatchesDoublePrecisionOverTheDequantizedWeightOnEveryInstructionSet) {
  at::manual_seed(26);
  for (Isa isa : kernels::runnable_isas()) {
    kernels::ScopedIsa cap(isa);
    for (const quant::QuantConfig c : {quant::QuantConfig{quant::Scheme::int8_weight, 0}, quant::QuantConfig{quant::Scheme::int8_weight, 32},
                                       quant::QuantConfig{quant::Scheme::int4_weight, 32}, quant::QuantConfig{quant::Scheme::int4_weight, 64}})
      for (int64_t rows : {1, 7, 33})
        for (int64_t in : {64, 320, 768})   // one depth block, a block and a tail, three blocks
          for (int64_t out : {16, 48, 272}) {   // a vector's columns, a wide strip's tail, a panel and more
            auto x = at::randn({rows, in}), w = at::randn({out, in}), b = at::randn({out});
            const auto q = quant::quantize_weight(w, c);
            auto y = at::empty({rows, out});
            const kernels::GemmQuantizedB qb{q.q.const_data_ptr(), q.scales.const_data_ptr<float>(), c.group_for(in),
                                             c.scheme == quant::Scheme::int4_weight};
            kernels::GemmProblem p{.rows = rows, .cols = out, .depth = in, .a = x.const_data_ptr<float>(), .a_row = in, .a_depth = 1,
                                   .b = nullptr, .b_depth = 1, .b_col = in, .c = y.mutable_data_ptr<float>(), .ldc = out,
                                   .bias = b.const_data_ptr<float>()};
            p.quantized_b = &qb;
            kernels::gemm(p);
            const auto ref = at::mm(x.to(at::kDouble), quant::dequantize_weight(q.q, q.scales, c, in).to(at::kDouble).t()) + b.to(at::kDouble);
            EXPECT_LT(max_abs_diff(y, ref), 2e-6 * in + 1e-5)
                << kernels::isa_name(isa) << " " << quant::scheme_name(c.scheme) << " g=" << c.group << " rows=" << rows << " in=" << in
                << " out=" << out;
          }
  }
}

TEST(QuantizedMatmul, APrefillWhoseRowsTheGemmCannotTakeWholeSplitsOffTheTailAndMatchesTheDequantizedWeight) {
  // 50 output rows (a vocabulary like GPT-2's 50257, not a multiple of the GEMM's 16 columns) over a
  // prefill of 40 rows: the first 48 through the dequantizing GEMM, the last 2 dequantized.
  at::manual_seed(27);
  at::NoGradGuard no_grad;
  // With AVX2 or more the integer GEMM takes the prompt instead (x rounded as decoding rounds it, its
  // columns masked rather than split); the baseline set takes the path this test is about.
  for (Isa isa : kernels::runnable_isas()) {
    kernels::ScopedIsa cap(isa);
    for (const quant::QuantConfig c : {quant::QuantConfig{quant::Scheme::int8_weight, 0}, quant::QuantConfig{quant::Scheme::int4_weight, 32}}) {
      const int64_t in = 64, out = 50;
      auto x = at::randn({40, in}), w = at::randn({out, in}), b = at::randn({out});
      const auto q = quant::quantize_weight(w, c);
      const auto y = quant::quantized_matmul(x, q.q, q.scales, c, in, b);
      const bool integer = kernels::qgemm_available(in, c.group_for(in));
      const auto ref = at::mm((integer ? x_as_computed(x, in, c) : x).to(at::kDouble), quant::dequantize_weight(q.q, q.scales, c, in).to(at::kDouble).t()) +
                       b.to(at::kDouble);
      ASSERT_EQ(y.sizes(), (std::vector<int64_t>{40, out}));
      EXPECT_LT(max_abs_diff(y, ref), 2e-6 * in + 1e-5) << kernels::isa_name(isa) << " " << quant::scheme_name(c.scheme);
    }
  }
}

namespace {

// A prefill of 6 tokens then one-token steps through ids [B, T] on the CPU, every kernel ours (no timing)
// but attention's `attention`, the decoding block fused or op by op; the logits of every step, concatenated.
// Masked: the first sequence's first two positions left out (left padding), the rule the fused attention
// takes as valid bytes.
at::Tensor decode_steps(nn::CausalLM& model, const at::Tensor& ids, bool masked, bool fused, nn::KernelPath attention) {
  const nn::KernelPath ours = nn::KernelPath::Ours;
  nn::KernelPolicy policy{attention, ours, ours, ours, ours, ours};
  policy.fused_decode_block = fused;
  nn::set_kernel_policy(policy);
  const int64_t b = ids.size(0), t = ids.size(1);
  auto cache = model.make_cache(b, t, c10::Device(c10::kCPU));
  nn::ForwardOptions o;
  o.cache = &cache;
  auto keys = at::ones({b, 1, 1, t}, at::kBool);
  keys[0].narrow(-1, 0, 2).fill_(false);
  auto mask_for = [&](int64_t from, int64_t n) {
    auto causal = at::ones({n, from + n}, at::kBool).tril(from);
    return (keys.narrow(-1, 0, from + n) & causal.view({1, 1, n, from + n})).contiguous();
  };
  if (masked) o.mask = mask_for(0, 6);
  std::vector<at::Tensor> steps{model.forward(ids.narrow(1, 0, 6), o)};
  for (int64_t s = 6; s < t; ++s) {
    if (masked) o.mask = mask_for(s, 1);
    steps.push_back(model.forward(ids.narrow(1, s, 1), o));
  }
  return at::cat(steps, 1);
}

}  // namespace

TEST(DecodeBlock, AFusedStepGivesTheOpByOpStepsBitsForEachFamilyWeightKindBatchAndMask) {
  // kernels/cpu/decode_block.h runs a pre-norm block's decoding step in one parallel region on the same
  // loops as the op-by-op path; with every kernel fixed to ours (no timing), the two must agree bit for bit.
  const nn::KernelPath ours = nn::KernelPath::Ours;
  struct Reset {
    ~Reset() { nn::set_kernel_policy({}); }
  } reset;
  // (SmoothQuant's decoding rows: x / s, then the int8 layer's kernel)
  const quant::QuantConfig schemes[] = {{quant::Scheme::int8_weight, 0}, {quant::Scheme::int4_weight, 32}, {quant::Scheme::int8_smoothquant, 0}};
  for (const std::string family : {"gpt", "opt", "bloom"})
    for (const auto& c : schemes) {
      const auto m = quantized_pair(family, c);
      // fp32 layers (the plain factory's: the dequantized copy) twice: their weights as they are, and with
      // the QKV weight a transposed view of W^T (GPT-2's Conv1D layout read in place: the fused step's
      // column-split product).
      auto transposed = quantized_pair(family, c).dequantized;
      for (auto& p : transposed->named_parameters())
        if (p.key().find("qkv.weight") != std::string::npos) p.value().set_data(p.value().t().contiguous().t());
      // and the quantized layers packed into the integer GEMM's panels where this CPU has it (AVX2), as
      // `colossal infer` packs them
      const std::pair<std::string, std::shared_ptr<nn::CausalLM>> models[] = {
          {"fp32", m.dequantized}, {"fp32 W^T", transposed}, {quant::scheme_name(c.scheme), m.quantized},
          {std::string(quant::scheme_name(c.scheme)) + " packed", quantized_pair(family, c, /*pack=*/true).quantized}};
      for (const auto& [kind, model] : models)
        for (const int64_t batch : {1, 3})
          for (const bool masked : {false, true}) {
            if (masked && batch == 1) continue;
            at::NoGradGuard no_grad;
            at::manual_seed(5);
            const auto ids = at::randint(0, 96, {batch, 11}, at::kLong);
            const std::string what = family + " " + kind + " B=" + std::to_string(batch) + (masked ? " masked" : "");
            const auto by_ops = decode_steps(*model, ids, masked, false, ours);
            const uint64_t before = kernels::decode_block_steps();
            const auto fused = decode_steps(*model, ids, masked, true, ours);
            EXPECT_EQ(kernels::decode_block_steps() - before, 2u * 5) << what << ": 2 blocks x 5 steps take the fused path";
            EXPECT_TRUE(at::equal(fused, by_ops)) << what << ": max diff " << max_abs_diff(fused, by_ops);
            if (family == "bloom") {   // ALiBi in the kernel against ATen's attention with alibi.h's bias tensor
              const auto aten = decode_steps(*model, ids, masked, false, nn::KernelPath::Aten);
              EXPECT_LT(max_abs_diff(fused, aten), 1e-5 * fused.abs().max().item<double>()) << what << ": against ATen's ALiBi";
            }
          }
    }
}

TEST(DecodeBlock, OverANarrowCacheTheFusedStepGivesTheOpByOpBitsAndFollowsTheFp32Cache) {
  // A model whose KV cache stores fp16, bf16 or int8 rows (kv_element.h): the fused block and the op-by-op
  // kernel store each new key and value as ATen's path does and read them back alike, so they agree bit
  // for bit; ATen's attention over the same cache agrees to fp32's rounding; and against the fp32 cache
  // the logits move, by no more than rounding (or quantizing) K and V allows.
  struct Reset {
    ~Reset() { nn::set_kernel_policy({}); }
  } reset;
  const nn::KernelPath ours = nn::KernelPath::Ours;
  for (const std::string family : {"gpt", "opt", "bloom"}) {
    const auto model = quantized_pair(family, {quant::Scheme::int8_weight, 0}).dequantized;   // fp32 layers
    at::NoGradGuard no_grad;
    at::manual_seed(5);
    const auto ids = at::randint(0, 96, {3, 11}, at::kLong);
    const auto fp32_cache = decode_steps(*model, ids, true, true, ours);
    const double scale = fp32_cache.abs().max().item<double>();
    for (const auto& [dtype, rounding] : {std::pair{at::kHalf, 1e-3}, {at::kBFloat16, 8e-3}, {at::kChar, 1e-2}}) {
      const std::string what = family + " " + std::string(c10::toString(dtype)) + " cache";
      model->set_kv_dtype(dtype);
      ASSERT_EQ(model->make_cache(1, 4, c10::Device(c10::kCPU)).layers[0].k.scalar_type(), dtype) << what;
      const auto by_ops = decode_steps(*model, ids, true, false, ours);
      const uint64_t before = kernels::decode_block_steps();
      const auto fused = decode_steps(*model, ids, true, true, ours);
      EXPECT_EQ(kernels::decode_block_steps() - before, 2u * 5) << what << ": 2 blocks x 5 steps take the fused path";
      EXPECT_TRUE(at::equal(fused, by_ops)) << what << ": max diff " << max_abs_diff(fused, by_ops);
      const auto aten = decode_steps(*model, ids, true, false, nn::KernelPath::Aten);
      EXPECT_LT(max_abs_diff(fused, aten), 1e-5 * scale) << what << ": against ATen's attention over the widened cache";
      const double moved = max_abs_diff(fused, fp32_cache);
      EXPECT_GT(moved, 0.0) << what << ": the cache rounds nothing";
      EXPECT_LT(moved, rounding * scale) << what << ": against the fp32 cache";
      model->set_kv_dtype(std::nullopt);
    }
  }
}
