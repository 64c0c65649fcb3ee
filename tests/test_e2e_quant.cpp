// `colossal quantize` end to end: a trained tiny GPT quantized with each scheme (the perplexity change on
// its held-out split within the issue's bounds, the files as documented), generation from the quantized
// directory (a batch decoding each prompt as alone), each decoder family's round trip, and the refusals
// (bad schemes and groups, quantizing twice, training from or streaming a quantized model, a damaged file).
#include <gtest/gtest.h>

#include <algorithm>
#include <regex>

#include "src/io/hf_weights.h"
#include "src/io/safetensors.h"
#include "support/test_support.h"

using colossal::test::expect_one_line_error;
using colossal::test::read_file;
using colossal::test::run_colossal;
using colossal::test::TempDir;
using colossal::test::write_file;

namespace {

std::string into(const TempDir& dir) {
  return " --set output.dir=" + (dir / "run") + " --set data.tokenizer=" + (dir / "tok.model") + " --set data.dataset=" + (dir / "data.h5");
}

// The "+0.12%" of quantize's perplexity line.
double perplexity_change_percent(const std::string& output) {
  std::smatch m;
  if (!std::regex_search(output, m, std::regex(R"(perplexity on \d+ tokens of .* \(held-out split\): [0-9.]+ -> [0-9.]+ \(([-+][0-9.]+)%\))")))
    return 1e9;
  return std::stod(m[1]);
}

// The "before -> after" perplexities of quantize's perplexity line.
std::pair<double, double> perplexities(const std::string& output) {
  std::smatch m;
  if (!std::regex_search(output, m, std::regex(R"(perplexity on \d+ tokens of .*: ([0-9.]+) -> ([0-9.]+) \()"))) return {-1, -1};
  return {std::stod(m[1]), std::stod(m[2])};
}

// Two model directories (one file or shards) hold the same tensors, name for name and bit for bit; or,
// not `exact`, floats within 1e-4 and integers within 1 of each other.
void expect_same_weights(const std::string& a, const std::string& b, bool exact) {
  const auto wa = colossal::HfWeights::open(a), wb = colossal::HfWeights::open(b);
  auto sorted = [](std::vector<std::string> v) {
    std::sort(v.begin(), v.end());
    return v;
  };
  ASSERT_EQ(sorted(wa.names()), sorted(wb.names())) << a << " against " << b;
  for (const auto& name : wa.names()) {
    const auto ta = wa.get(name), tb = wb.get(name);
    ASSERT_TRUE(ta.scalar_type() == tb.scalar_type() && ta.sizes() == tb.sizes()) << name;
    if (exact) EXPECT_TRUE(ta.equal(tb)) << name;
    else if (ta.is_floating_point()) EXPECT_TRUE(ta.allclose(tb, 1e-4, 1e-6)) << name;
    else EXPECT_LE((ta.to(at::kInt) - tb.to(at::kInt)).abs().max().item<int>(), 1) << name;
  }
}

// Quantizes `ckpt` block at a time into `out`, cut into files of 200 KB, and checks it wrote what the
// whole-model quantizer wrote into `whole` (whose output is `whole_output`) and scored the same perplexities.
void expect_streamed_quantize_matches(const std::string& ckpt, const std::string& flags, const std::string& whole,
                                      const std::string& whole_output, const std::string& out, const std::string& cache) {
  auto q = run_colossal("quantize " + ckpt + " --out " + out + " " + flags + " --stream-weights on --stream-cache " + cache +
                        " --max-shard-gb 0.0002 -q");
  ASSERT_EQ(q.exit_code, 0) << q.output;
  EXPECT_NE(q.output.find("safetensors files), block at a time"), std::string::npos) << q.output;
  EXPECT_TRUE(std::filesystem::exists(out + "/model.safetensors.index.json")) << flags;
  // SmoothQuant's calibration ran over the streamed blocks (GPT-2's transposed views in the files),
  // whose GEMM may round otherwise: its factors, and so a few integers, can differ in the last place.
  expect_same_weights(whole, out, /*exact=*/flags.find("smoothquant") == std::string::npos);
  EXPECT_EQ(colossal::test::read_json_file(out + "/config.json"), colossal::test::read_json_file(whole + "/config.json")) << flags;
  // The passes over text streamed the blocks from the disk: the same perplexities, to the printed digits
  // but the last (the streamed GPT-2 weights are transposed views, whose GEMM may round otherwise).
  const auto [before, after] = perplexities(q.output);
  const auto [whole_before, whole_after] = perplexities(whole_output);
  ASSERT_GT(whole_before, 0) << whole_output;
  EXPECT_NEAR(before, whole_before, 2e-4 * whole_before) << q.output;
  EXPECT_NEAR(after, whole_after, 2e-4 * whole_after) << q.output;
}

}  // namespace

TEST(QuantizeEndToEnd, ATrainedGptQuantizesWithinItsPerplexityBoundsAndGeneratesFromTheQuantizedDirectory) {
  TempDir dir;
  auto train = run_colossal("train recipes/gpt-tiny.toml --set train.max_steps=100 --set train.eval_every=0 -q" + into(dir));
  ASSERT_EQ(train.exit_code, 0) << train.output;
  const std::string ckpt = dir / "run";
  struct Scheme {
    std::string flags;
    double max_change_percent;   // the issue's bounds: int8 1%, int4 5%
    const char* dtype;
  };
  for (const Scheme& s : {Scheme{"--scheme int8-weight", 1.0, "I8"}, Scheme{"--scheme int8-weight --group-size 64", 1.0, "I8"},
                          Scheme{"--scheme int8-smoothquant --calib-tokens 2048", 2.0, "I8"},
                          Scheme{"--scheme int4-weight --group-size 32", 5.0, "U8"}}) {
    const std::string out = dir / "q";
    auto q = run_colossal("quantize " + ckpt + " --out " + out + " " + s.flags + " --eval-tokens 4096 -q");
    ASSERT_EQ(q.exit_code, 0) << q.output;
    EXPECT_NE(q.output.find("quantized 8 linear layers"), std::string::npos) << q.output;
    EXPECT_LT(perplexity_change_percent(q.output), s.max_change_percent) << q.output;
    // The files: I8 (or packed U8) integers and F32 scales under the HF names, the scheme in config.json;
    // the token embedding (the tied head) as int8 rows whatever the scheme, the position table in fp32.
    const auto config = colossal::test::read_json_file(out + "/config.json");
    EXPECT_EQ(config["quantization_config"]["quant_method"], "colossal") << s.flags;
    const auto header = colossal::read_safetensors_header(out + "/model.safetensors");
    int qweights = 0;
    for (const auto& e : header.entries) {
      if (e.name == "transformer.wpe.weight") EXPECT_EQ(e.dtype, at::kFloat);
      if (!e.name.ends_with(".qweight")) continue;
      ++qweights;
      const bool embedding = e.name == "transformer.wte.qweight";
      EXPECT_EQ(e.dtype, embedding || std::string(s.dtype) == "I8" ? at::kChar : at::kByte) << e.name;
    }
    EXPECT_EQ(qweights, 9) << s.flags << ": 8 linear layers and the token embedding";
    EXPECT_TRUE(std::filesystem::exists(out + "/tokenizer.model"));
    // Block at a time (a model larger than memory): the same tensors, sharded as save_pretrained shards.
    expect_streamed_quantize_matches(ckpt, s.flags + " --eval-tokens 4096", out, q.output, dir / "qs", dir.path());
    // Generation: a batch of two prompts decodes each as it decodes alone (the quantized GEMV's rows).
    write_file(dir / "prompts.txt", "In the beginning\nThe LORD is my shepherd;\n");
    auto batch = run_colossal("infer " + out + " --prompts " + (dir / "prompts.txt") + " -n 16 --greedy --jsonl -q");
    auto alone = run_colossal("infer " + out + " -p 'The LORD is my shepherd;' -n 16 --greedy --jsonl -q");
    ASSERT_EQ(batch.exit_code, 0) << batch.output;
    ASSERT_EQ(alone.exit_code, 0) << alone.output;
    const auto second = nlohmann::json::parse(batch.output.substr(batch.output.find('\n') + 1));
    EXPECT_EQ(second["completion"], nlohmann::json::parse(alone.output)["completion"]) << s.flags;
    EXPECT_EQ(second["completion_tokens"], 16) << s.flags;
    {
      // Streamed from the disk (a model larger than memory): the blocks' integers and scales are read in
      // place as stored and decoded by the row layout's GEMV. With the kernels below the packed GEMM, the
      // model in memory takes that GEMV too, so the tokens are the same.
      setenv("COLOSSAL_CPU_ISA", "baseline", 1);
      const std::string run = "infer " + out + " --prompts " + (dir / "prompts.txt") + " -n 16 --greedy --jsonl -q";
      auto in_memory = run_colossal(run);
      auto streamed = run_colossal(run + " --stream-weights --stream-source checkpoint");   // mapped
      auto direct = run_colossal(run + " --stream-weights --stream-source checkpoint --stream-io direct");
      auto cached = run_colossal(run + " --stream-weights --stream-source cache --stream-cache " + dir.path());
      unsetenv("COLOSSAL_CPU_ISA");
      ASSERT_EQ(in_memory.exit_code, 0) << in_memory.output;
      EXPECT_EQ(streamed.output, in_memory.output) << s.flags;
      EXPECT_EQ(direct.output, in_memory.output) << s.flags;
      EXPECT_EQ(cached.output, in_memory.output) << s.flags;
    }
    // Split across two ranks (1D: each its quantized pieces), the same tokens as one process.
    auto split = run_colossal("infer " + out + " --prompts " + (dir / "prompts.txt") + " -n 16 --greedy --jsonl -q --tensor-parallel 2");
    if (s.flags.find("smoothquant") != std::string::npos) {
      EXPECT_NE(split.exit_code, 0);
      EXPECT_NE(split.output.find("int8-smoothquant, whose activations are quantized per token over a whole row"), std::string::npos)
          << split.output;
      continue;
    }
    ASSERT_EQ(split.exit_code, 0) << s.flags << ": " << split.output;
    EXPECT_EQ(split.output, batch.output) << s.flags;
  }

  // --kv-cache: the quantized model also scored through a KV cache. Through an fp32 cache it is the
  // model's own perplexity (the cached prefill against the fused loss: fp32's rounding); through an int8
  // cache it moves, within int8 weights' own bound.
  for (const std::string kv : {"fp32", "int8"}) {
    auto q = run_colossal("quantize " + ckpt + " --out " + (dir / "qkv") + " --scheme int8-weight --eval-tokens 4096 -q --kv-cache " + kv);
    ASSERT_EQ(q.exit_code, 0) << q.output;
    const auto [before, after] = perplexities(q.output);
    std::smatch m;
    ASSERT_TRUE(std::regex_search(q.output, m, std::regex("perplexity through a KV cache of " + kv + R"(: ([0-9.]+) \()"))) << q.output;
    const double through = std::stod(m[1]);
    if (kv == "fp32") EXPECT_NEAR(through, after, 2e-4 * after) << q.output;
    else EXPECT_NE(through, after) << q.output;
    EXPECT_LT(through, before * 1.01) << q.output;
  }
  expect_one_line_error(run_colossal("quantize " + ckpt + " --out " + (dir / "x") + " --kv-cache fp8"), "--kv-cache: fp8 not in {fp32,fp16,bf16,int8}");

  const std::string out = dir / "q";   // int4 in groups of 32, the last written
  // Refusals, each one line naming what would be valid.
  expect_one_line_error(run_colossal("quantize " + ckpt + " --out " + (dir / "x") + " --scheme int3-weight"),
                        "unknown quantization scheme \"int3-weight\" (valid: int8-weight, int4-weight, int8-smoothquant)");
  expect_one_line_error(run_colossal("quantize " + ckpt + " --out " + (dir / "x") + " --scheme int4-weight --group-size 48"), "try 32, 64 or 128");
  expect_one_line_error(run_colossal("quantize " + ckpt + " --out " + (dir / "x") + " --scheme int4-weight --group-size 0"),
                        "positive multiple of 32");
  expect_one_line_error(run_colossal("quantize " + ckpt + " --out " + (dir / "x") + " --scheme int8-weight --group-size 256"),
                        "has 128 inputs, which groups of 256 do not divide");
  expect_one_line_error(run_colossal("quantize " + out + " --out " + (dir / "x")), "is already quantized");
  expect_one_line_error(run_colossal("train recipes/gpt-tiny.toml --set model.from=" + out + " --set train.max_steps=1 --set optim.warmup_steps=0" + into(dir)),
                        "holds quantized weights");
  EXPECT_FALSE(std::filesystem::exists(dir / "x")) << "a refused quantize left a directory behind";
  // A qweight stored as floats (a hand-edited or foreign file) is refused by name, not reinterpreted.
  auto file = colossal::load_safetensors(out + "/model.safetensors");
  for (auto& t : file.tensors)
    if (t.name.ends_with(".qweight")) t.tensor = t.tensor.to(at::kFloat);
  colossal::save_safetensors(out + "/model.safetensors", file.tensors, file.metadata);
  expect_one_line_error(run_colossal("infer " + out + " -p hi -q"), "holds Float values (expected Char)");
}

// The other decoder families through the same command: each scheme quantizes, saves and generates.
class QuantizeFamilies : public ::testing::TestWithParam<const char*> {};

TEST_P(QuantizeFamilies, EachSchemeQuantizesSavesAndGenerates) {
  TempDir dir;
  const std::string recipe = std::string("recipes/") + GetParam() + "-tiny.toml";
  auto train = run_colossal("train " + recipe + " --set train.max_steps=4 --set optim.warmup_steps=2 --set train.eval_every=0 -q" + into(dir));
  ASSERT_EQ(train.exit_code, 0) << train.output;
  for (const char* scheme : {"int8-weight", "int4-weight --group-size 32", "int8-smoothquant --calib-tokens 1024"}) {
    auto q = run_colossal("quantize " + (dir / "run") + " --out " + (dir / "q") + " --scheme " + scheme + " --eval-tokens 1024 -q");
    ASSERT_EQ(q.exit_code, 0) << q.output;
    EXPECT_NE(q.output.find("quantized 8 linear layers"), std::string::npos) << q.output;
    // Kernels fixed: the model trained 4 steps has near-tied logits, which two processes' first-use
    // timings (ours or ATen's GEMM) could otherwise break apart differently.
    auto infer = run_colossal("infer " + (dir / "q") + " -p 'And God said' -n 8 --greedy --kernels fused -q");
    ASSERT_EQ(infer.exit_code, 0) << infer.output;
    EXPECT_EQ(infer.output.rfind("And God said", 0), 0u) << infer.output;
    // Block at a time, the passes over text streaming the blocks through a cache of our layout (OPT's
    // separate q/k/v, BLOOM's interleaved heads): the same tensors, which generate the same text.
    const std::string flags = std::string("--scheme ") + scheme + " --eval-tokens 1024";
    expect_streamed_quantize_matches(dir / "run", flags, dir / "q", q.output, dir / "qs", dir.path());
    auto sharded = run_colossal("infer " + (dir / "qs") + " -p 'And God said' -n 8 --greedy --kernels fused -q");
    EXPECT_EQ(sharded.output, infer.output);
  }
}

INSTANTIATE_TEST_SUITE_P(Families, QuantizeFamilies, ::testing::Values("opt", "bloom"),
                         [](const auto& info) { return std::string(info.param); });
