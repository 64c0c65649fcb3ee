// End to end with Hugging Face model directories: `colossal infer DIR` generates as transformers'
// generate does from the same directory, `colossal finetune` with [model] from trains a directory
// in any weight format and saves a checkpoint that carries the directory's tokenizer files and
// config fields, and a bad starting point ends in one error line at the recipe key.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "src/data/tokenizer.h"
#include "src/io/safetensors.h"
#include "tests/support/test_support.h"

namespace fs = std::filesystem;
using namespace colossal;
using test::fixture;
using test::read_file;
using test::run_colossal;
using test::TempDir;

namespace {

// opt-125m-finetune.toml shrunk to a few steps on the tiny fixture, every output inside `dir`.
std::string finetune_args(const TempDir& dir, const std::string& from, int steps) {
  return "finetune recipes/opt-125m-finetune.toml --set model.from=" + from + " --set train.max_steps=" + std::to_string(steps) +
         " --set optim.warmup_steps=1 --set train.batch_size=2 --set train.seq_len=32 --set train.eval_batches=2" +
         " --set train.eval_every=" + std::to_string(steps) + " --set checkpoint.every=" + std::to_string(steps) +
         " --set output.dir=" + (dir / "run") + " --set data.dataset=" + (dir / "data.h5");
}

// JSON text as --jsonl prints it (bytes that are not UTF-8 become U+FFFD).
std::string as_json(const std::string& s) { return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

// make_opt.py / make_bloom.py's greedy reference: the prompt's token count and the tokens generate() added.
struct GreedyReference {
  int64_t prompt_tokens = 0;
  std::vector<int> fresh;
};
GreedyReference greedy_reference(const std::string& dir) {
  const auto ref = load_safetensors(dir + "/reference.safetensors");
  const at::Tensor prompt = ref.at("greedy.prompt", "ref"), output = ref.at("greedy.output", "ref");
  GreedyReference r{prompt.size(1), {}};
  for (int64_t i = prompt.size(1); i < output.size(1); ++i) r.fresh.push_back(static_cast<int>(output[0][i].item<int64_t>()));
  return r;
}

}  // namespace

class InferFromDirectory : public ::testing::TestWithParam<std::string> {};

TEST_P(InferFromDirectory, GeneratesWhatTransformersGenerates) {
  // make_opt.py / make_bloom.py: tokenizer("In the beginning God created") (OPT's prepends </s>),
  // then generate() greedily for 10 tokens.
  const std::string dir = fixture(GetParam());
  const GreedyReference ref = greedy_reference(dir);
  const auto tok = Tokenizer::load(dir);
  ASSERT_EQ(std::count(ref.fresh.begin(), ref.fresh.end(), *tok.end_of_text()), 0) << "the reference stops early; regenerate it";

  auto r = run_colossal("infer " + dir + " -p 'In the beginning God created' --greedy -n 10 --jsonl -q");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["prompt_tokens"], ref.prompt_tokens);
  EXPECT_EQ(j["completion_tokens"], 10);
  EXPECT_EQ(j["completion"].dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), as_json(tok.decode(ref.fresh, true)));
}

TEST_P(InferFromDirectory, TwoTensorParallelRanksGenerateWhatOneProcessGenerates) {
  // Greedy as transformers does, and a sampled batch of two prompts token for token as one process
  // samples it (the logits are gathered whole on every rank, so every rank draws the same tokens).
  const std::string dir = fixture(GetParam());
  const GreedyReference ref = greedy_reference(dir);
  auto r = run_colossal("infer " + dir + " -p 'In the beginning God created' --greedy -n 10 --jsonl -q --tensor-parallel 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(nlohmann::json::parse(r.output)["completion"].dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
            as_json(Tokenizer::load(dir).decode(ref.fresh, true)));
  const std::string sampled = "infer " + dir + " -p 'In the beginning' -p 'And God said' -t 0.9 --top-p 0.95 --seed 7 -n 12 --jsonl -q";
  auto one = run_colossal(sampled), two = run_colossal(sampled + " --tensor-parallel 2");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  ASSERT_EQ(two.exit_code, 0) << two.output;
  EXPECT_EQ(two.output, one.output);
}

TEST_P(InferFromDirectory, ANarrowKvCacheGeneratesWhatTransformersGeneratesInOneProcessAndSplit) {
  // --kv-cache fp16, bf16 and int8 (kv_element.h): keys and values rounded to 16 bits, or quantized to
  // int8 rows, leave these fixtures' greedy tokens as transformers' fp32 ones; a split job's workers get
  // the option too (their cache stores as one process's, so the sampled batch matches it token for token).
  const std::string dir = fixture(GetParam());
  const GreedyReference ref = greedy_reference(dir);
  const std::string want = as_json(Tokenizer::load(dir).decode(ref.fresh, true));
  for (const std::string kv : {"fp16", "bf16", "int8"}) {
    auto r = run_colossal("infer " + dir + " -p 'In the beginning God created' --greedy -n 10 --jsonl --kv-cache " + kv);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("KV cache: " + kv + " keys and values"), std::string::npos) << r.output;
    const std::string line = r.output.substr(r.output.find('{'));
    EXPECT_EQ(nlohmann::json::parse(line.substr(0, line.find('\n')))["completion"].dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
              want) << kv;
  }
  const std::string sampled = "infer " + dir + " -p 'In the beginning' -p 'And God said' -t 0.9 --seed 7 -n 12 --jsonl -q --kv-cache int8";
  auto one = run_colossal(sampled), two = run_colossal(sampled + " --tensor-parallel 2");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  ASSERT_EQ(two.exit_code, 0) << two.output;
  EXPECT_EQ(two.output, one.output);
  auto bad = run_colossal("infer " + dir + " -p x --kv-cache fp8");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("--kv-cache: fp8 not in {auto,fp32,fp16,bf16,int8}"), std::string::npos) << bad.output;
}

TEST(EndToEndHf, ATensorSplitThatDoesNotDivideTheModelIsRefusedBeforeAnyWorkerStarts) {
  auto r = run_colossal("infer " + fixture("opt-tiny") + " -p x --tensor-parallel 3");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--tensor-parallel = 3 does not divide the model's n_head = 4 (tensor sizes that divide every split dimension: 1, 2, 4)"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("rank 0"), std::string::npos) << "no worker started: " << r.output;
}

TEST_P(InferFromDirectory, StreamedBlocksComeThroughTheCacheWhereTheFilesLayoutsDifferFromOurs) {
  // OPT stores q, k and v apart and BLOOM interleaves its heads, so their blocks cannot be viewed in the
  // file: streaming converts them into a cache once and generates what transformers generates.
  const std::string dir = fixture(GetParam());
  const GreedyReference ref = greedy_reference(dir);
  TempDir cache;
  const std::string args = "infer " + dir + " -p 'In the beginning God created' --greedy -n 10 --jsonl --stream-weights --stream-cache " + cache.path();
  auto r = run_colossal(args);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("cache in " + cache.path()), std::string::npos) << r.output;
  const std::string line = r.output.substr(r.output.find('{'));
  EXPECT_EQ(nlohmann::json::parse(line.substr(0, line.find('\n')))["completion"].dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
            as_json(Tokenizer::load(dir).decode(ref.fresh, true)));
  test::expect_one_line_error(run_colossal(args + " --stream-source checkpoint"), "cannot be read in place");
}

INSTANTIATE_TEST_SUITE_P(Decoders, InferFromDirectory, ::testing::Values("opt-tiny", "bloom-tiny"), [](const auto& info) {
  return info.param == "opt-tiny" ? std::string("opt") : std::string("bloom");
});

TEST(EndToEndHf, FinetuningAModelDirectorySavesItsTokenizerAndConfigWithTheWeights) {
  TempDir dir;
  auto ft = run_colossal(finetune_args(dir, fixture("opt-tiny"), 3));
  ASSERT_EQ(ft.exit_code, 0) << ft.output;
  EXPECT_NE(ft.output.find("initialised from " + fixture("opt-tiny")), std::string::npos) << ft.output;
  const std::string ckpt = dir / "run/checkpoints/step-000003";
  for (const char* file : {"tokenizer.json", "tokenizer_config.json"})
    EXPECT_EQ(read_file(ckpt + "/" + file), read_file(fixture("opt-tiny/") + file)) << file;
  const auto config = nlohmann::json::parse(read_file(ckpt + "/config.json"));
  const auto source = nlohmann::json::parse(read_file(fixture("opt-tiny/config.json")));
  EXPECT_EQ(config["transformers_version"], source["transformers_version"]);   // a field only the source had
  EXPECT_EQ(config["init_std"], source["init_std"]);
  EXPECT_EQ(config["dtype"], "float32");
  EXPECT_EQ(config["num_hidden_layers"], source["num_hidden_layers"]);
  // The checkpoint is a model directory again: it generates with the same tokenizer.
  auto infer = run_colossal("infer " + (dir / "run") + " -p 'And God said' -n 4 --jsonl -q");
  ASSERT_EQ(infer.exit_code, 0) << infer.output;
  EXPECT_EQ(nlohmann::json::parse(infer.output)["prompt_tokens"], Tokenizer::load(fixture("opt-tiny")).encode("And God said", true).size());
}

TEST(EndToEndHf, AnyWeightFormatStartsAFinetune) {
  TempDir dir;
  const std::string model = dir / "opt-bin";   // pytorch_model.bin and the fixture's tokenizer
  fs::copy(fixture("opt-tiny-formats/bin"), model);
  for (const char* file : {"tokenizer.json", "tokenizer_config.json"}) fs::copy(fixture("opt-tiny/") + file, model + "/" + file);
  auto ft = run_colossal(finetune_args(dir, model, 1));
  ASSERT_EQ(ft.exit_code, 0) << ft.output;
  EXPECT_TRUE(fs::is_regular_file(dir / "run/checkpoints/step-000001/model.safetensors"));
}

TEST(EndToEndHf, ABadStartingPointIsOneErrorLineAtTheRecipeKey) {
  TempDir dir;
  test::expect_one_line_error(run_colossal(finetune_args(dir, dir / "absent", 1)), "--set model.from: checkpoint " + (dir / "absent") +
                                                                                         ": no such file or directory");
  test::expect_one_line_error(run_colossal(finetune_args(dir, fixture("opt-tiny-formats/bin"), 1)), "no tokenizer files");
  test::expect_one_line_error(run_colossal(finetune_args(dir, fixture("opt-tiny"), 1) + " --set model.n_layer=5"),
                              "--set model.n_layer: = 5 but checkpoint " + fixture("opt-tiny") + " has 2");
  test::expect_one_line_error(run_colossal(finetune_args(dir, fixture("opt-tiny"), 1) + " --set train.seq_len=100"),
                              "--set train.seq_len: = 100 exceeds the context of " + fixture("opt-tiny") + " (64 positions)");
  test::expect_one_line_error(run_colossal(finetune_args(dir, fixture("opt-tiny"), 1) + " --set finetune.from=" + fixture("opt-tiny")),
                              "both name a starting point");
}
