// Recipe parsing: defaults, overrides, and one test per kind of error, each checking that the
// message names the file, the line and the key, and says what would be valid.
#include <gtest/gtest.h>

#include <filesystem>

#include "src/core/error.h"
#include "src/core/recipe.h"
#include "tests/support/test_support.h"

using namespace colossal;

namespace {

std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    parse_recipe(text, "r.toml", overrides);
  } catch (const RecipeError& e) {
    return e.what();
  }
  return "(no error)";
}

// Each recipe text is refused with an error containing its message.
void expect_errors(const std::vector<std::pair<std::string, std::string>>& cases) {
  for (const auto& [text, message] : cases) {
    const std::string e = error_of(text);
    EXPECT_NE(e.find(message), std::string::npos) << text << " -> " << e;
  }
}

}  // namespace

TEST(Recipe, DefaultsFillEverySectionAndDerivedValues) {
  Recipe r = parse_recipe("name = \"x\"\n[model]\nblock_size = 64\n", "r.toml");
  EXPECT_EQ(r.name, "x");
  EXPECT_EQ(r.model.block_size, 64);
  EXPECT_EQ(r.train.seq_len, 64);                 // 0 means the model's context
  EXPECT_EQ(r.optim.decay_steps, r.train.max_steps);
  EXPECT_EQ(r.output.dir, "runs/x");
  EXPECT_EQ(r.checkpoint.dir, "runs/x/checkpoints");
  EXPECT_EQ(r.data.tokenizer_vocab, r.model.vocab_size);
}

TEST(Recipe, SetOverridesReplaceFileValuesAndAcceptBareStrings) {
  Recipe r = parse_recipe("[train]\nbatch_size = 4\n", "r.toml",
                          {"train.batch_size=12", "optim.lr=1e-4", "data.text=some/file.txt", "optim.betas=[0.8, 0.9]"});
  EXPECT_EQ(r.train.batch_size, 12);
  EXPECT_DOUBLE_EQ(r.optim.lr, 1e-4);
  EXPECT_EQ(r.data.text, "some/file.txt");
  EXPECT_DOUBLE_EQ(r.optim.betas[0], 0.8);
  EXPECT_EQ(r.where("train.batch_size"), "--set train.batch_size");
}

TEST(RecipeErrors, UnknownKeySuggestsNearestName) {
  std::string e = error_of("[optim]\nlr = 1e-3\nwarmup_step = 10\n");
  EXPECT_EQ(e, "r.toml:3: unknown key \"warmup_step\" in [optim] (did you mean \"warmup_steps\"?)");
}

TEST(RecipeErrors, UnknownKeyFarFromAnyNameGetsNoSuggestion) {
  std::string e = error_of("[train]\ncolour = 3\n");
  EXPECT_EQ(e, "r.toml:2: unknown key \"colour\" in [train]");
}

TEST(RecipeErrors, UnknownSectionSuggestsNearest) {
  std::string e = error_of("[modle]\nn_layer = 2\n");
  EXPECT_NE(e.find("r.toml:1: unknown section [modle] (did you mean [model]?)"), std::string::npos) << e;
}

TEST(RecipeErrors, WrongTypeNamesLineKeyAndExpectedType) {
  std::string e = error_of("[model]\nn_layer = \"twelve\"\n");
  EXPECT_EQ(e, "r.toml:2: [model] n_layer: must be an integer, not a string");
  e = error_of("[train]\nbatch_size = 8.0\n");
  EXPECT_NE(e.find("r.toml:2: [train] batch_size: must be an integer"), std::string::npos) << e;
}

TEST(RecipeErrors, OutOfRangeSaysWhatIsValid) {
  std::string e = error_of("[model]\ndropout = 1.5\n");
  EXPECT_NE(e.find("r.toml:2: [model] dropout: = 1.5 is out of range (valid: 0 to 0.99)"), std::string::npos) << e;
  e = error_of("[train]\nbatch_size = 0\n");
  EXPECT_NE(e.find("r.toml:2: [train] batch_size: = 0 is out of range (valid: 1 to"), std::string::npos) << e;
}

TEST(RecipeErrors, HeadsNotDividingWidthSuggestsDivisors) {
  std::string e = error_of("[model]\nn_embd = 768\nn_head = 10\n");
  EXPECT_EQ(e, "r.toml:3: [model] n_head: = 10 does not divide n_embd = 768 (try 6, 8 or 12)");
}

TEST(RecipeErrors, SequenceLongerThanContextIsRejected) {
  std::string e = error_of("[model]\nblock_size = 64\n[train]\nseq_len = 128\n");
  EXPECT_NE(e.find("r.toml:4: [train] seq_len: = 128 exceeds model.block_size = 64"), std::string::npos) << e;
}

TEST(RecipeErrors, InvalidChoiceListsChoices) {
  std::string e = error_of("[train]\ndevice = \"gpu\"\n");
  EXPECT_NE(e.find("r.toml:2: [train] device: = \"gpu\" is not one of auto | cpu | cuda"), std::string::npos) << e;
}

TEST(RecipeErrors, KernelChoicesAreAutoFusedOrAten) {
  std::string e = error_of("[kernels]\nattention = \"fast\"\n");
  EXPECT_NE(e.find("r.toml:2: [kernels] attention: = \"fast\" is not one of auto | fused | aten"), std::string::npos) << e;
  auto r = parse_recipe("[kernels]\ngemv = \"aten\"\nlayer_norm = \"fused\"\n", "r.toml", {"kernels.gelu=fused"});
  EXPECT_EQ(r.kernels.attention, "auto");
  EXPECT_EQ(r.kernels.gelu, "fused");
  EXPECT_EQ(r.kernels.gemv, "aten");
  EXPECT_EQ(r.kernels.layer_norm, "fused");
  EXPECT_EQ(r.kernels.gemm, "auto");
  EXPECT_EQ(parse_recipe("[kernels]\ngemm = \"aten\"\n", "r.toml", {}).kernels.gemm, "aten");
  e = error_of("[kernels]\nlayer_norm = \"yes\"\n");
  EXPECT_NE(e.find("r.toml:2: [kernels] layer_norm: = \"yes\" is not one of auto | fused | aten"), std::string::npos) << e;
}

TEST(RecipeErrors, TokenizerLargerThanModelVocabulary) {
  std::string e = error_of("[model]\nvocab_size = 1000\n[data]\ntokenizer_vocab = 2000\n");
  EXPECT_NE(e.find("r.toml:4: [data] tokenizer_vocab: = 2000 exceeds model.vocab_size = 1000"), std::string::npos) << e;
}

TEST(RecipeErrors, OverrideErrorsNameTheOverride) {
  std::string e = error_of("", {"train.batch_size=-3"});
  EXPECT_NE(e.find("--set train.batch_size: = -3 is out of range"), std::string::npos) << e;
  e = error_of("", {"train.lr"});
  EXPECT_NE(e.find("--set train.lr: expected section.key=value"), std::string::npos) << e;
}

TEST(RecipeErrors, InvalidTomlNamesLine) {
  std::string e = error_of("[model]\nn_layer = = 3\n");
  EXPECT_NE(e.find("r.toml:2: invalid TOML"), std::string::npos) << e;
}

TEST(RecipeErrors, MissingFileIsAnError) {
  try {
    load_recipe("does/not/exist.toml");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("recipe does/not/exist.toml: no such file"), std::string::npos) << e.what();
  }
}

TEST(Recipe, EveryShippedRecipeParsesAndRoundTripsThroughToml) {
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(colossal::test::source_dir() + "/recipes")) {
    if (entry.path().extension() != ".toml") continue;
    Recipe r = load_recipe(entry.path().string());
    Recipe again = parse_recipe(r.to_toml(), "resolved.toml");
    EXPECT_EQ(again.to_toml(), r.to_toml()) << entry.path();
    ++count;
  }
  EXPECT_GE(count, 7);
}

TEST(RecipeErrors, SetValuesAreOneValueAndUnknownSectionsFromSetAreReportedThere) {
  // A line break used to let the rest parse as more keys, silently dropped.
  std::string e = error_of("", {"optim.lr=5\nmodel.n_layer=7"});
  EXPECT_NE(e.find("--set optim.lr: the value contains a control character (byte 10 at offset 1); give one value per --set"),
            std::string::npos) << e;
  e = error_of("", {std::string("data.text=a\0b", 13)});
  EXPECT_NE(e.find("--set data.text: the value contains a control character (byte 0 at offset 1)"), std::string::npos) << e;
  e = error_of("[model]\n", {"foo.bar=1"});
  EXPECT_NE(e.find("--set foo.bar: unknown section [foo]"), std::string::npos) << e;
  EXPECT_EQ(e.find(":0"), std::string::npos) << e;
  e = error_of("", {"lr"});
  EXPECT_NE(e.find("(e.g. --set optim.lr=1e-4)"), std::string::npos) << e;
  EXPECT_EQ(error_of("", {"optim.lr=1e-4"}), "(no error)");   // the example the help gives
}

TEST(RecipeErrors, NamesAndPathsArePlainTextAndTheNameIsOneDirectory) {
  std::string e = error_of("name = \"\"\n");
  EXPECT_NE(e.find("= \"\" is not a usable run name"), std::string::npos) << e;
  e = error_of("name = \"a/b\"\n");
  EXPECT_NE(e.find("is not a usable run name"), std::string::npos) << e;
  e = error_of("name = \"ab\\u0000cd\"\n");
  EXPECT_NE(e.find("r.toml:1: name: contains a control character (byte 0 at offset 2)"), std::string::npos) << e;
  e = error_of("[data]\ntext = \"corpus\\n.txt\"\n");
  EXPECT_NE(e.find("r.toml:2: [data] text: contains a control character (byte 10 at offset 6)"), std::string::npos) << e;
}

TEST(RecipeErrors, HugeNumbersPrintShortly) {
  std::string e = error_of("[train]\nbatch_size = 1e308\n");
  EXPECT_NE(e.find("must be an integer, not 1e+308 (write it without a decimal point)"), std::string::npos) << e;
  e = error_of("[optim]\nlr = 1e308\n");
  EXPECT_NE(e.find("[optim] lr: = 1e+308 is out of range (valid: 1e-12 to 10)"), std::string::npos) << e;
  EXPECT_LT(e.size(), 120u) << e;
}

TEST(RecipeErrors, ADirectoryOrAnEmptyFileIsNotARecipe) {
  colossal::test::TempDir dir;
  auto error_loading = [](const std::string& path) {
    try {
      load_recipe(path);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(error_loading(dir.path()).find("is a directory, not a TOML file"), std::string::npos) << error_loading(dir.path());
  colossal::test::write_file(dir / "empty.toml", "\n  \n");
  EXPECT_NE(error_loading(dir / "empty.toml").find("empty.toml: is empty"), std::string::npos);
}

TEST(RecipeErrors, NonAsciiOutsideStringsIsRefusedBeforeTheTomlParserSeesIt) {
  // TOML++ 3.3 reaches __builtin_unreachable on such characters (found by tests/fuzz).
  std::string e = error_of("[model]\nn_layer = 2 \xc3\xa9\n");
  EXPECT_NE(e.find("r.toml:2: invalid TOML: a non-ASCII character outside a quoted string or comment"), std::string::npos) << e;
  e = error_of("caf\xc3\xa9 = 1\n");
  EXPECT_NE(e.find("r.toml:1: invalid TOML: a non-ASCII"), std::string::npos) << e;
  // Inside strings (any quoting) and comments it is text like any other.
  Recipe r = parse_recipe("# caf\xc3\xa9\nname = \"caf\xc3\xa9\"\n[data]\ntext = 'd\xc3\xa9j\xc3\xa0.txt'\n", "r.toml",
                          {"data.tokenizer=caf\xc3\xa9.model", "data.dataset=\"\xc3\xa9.h5\""});
  EXPECT_EQ(r.name, "caf\xc3\xa9");
  EXPECT_EQ(r.data.text, "d\xc3\xa9j\xc3\xa0.txt");
  EXPECT_EQ(r.data.tokenizer, "caf\xc3\xa9.model");   // a bare --set value stays a string
  EXPECT_EQ(r.data.dataset, "\xc3\xa9.h5");
}

TEST(RecipeErrors, MemoryKeysNameTheirValidChoices) {
  Recipe r = parse_recipe("[memory]\nzero = 2\nchunk_size_mb = 16\n", "r.toml");
  EXPECT_EQ(r.memory.zero, 2);
  EXPECT_EQ(r.memory.chunk_size_mb, 16);
  EXPECT_EQ(parse_recipe("[memory]\nchunk_size_mb = \"auto\"\n", "r.toml").memory.chunk_size_mb, 0);
  const std::string toml = r.to_toml(), memory = toml.substr(toml.find("[memory]\n"));
  EXPECT_NE(memory.substr(0, memory.find("\n[")).find("\nchunk_size_mb = 16"), std::string::npos) << toml;
  expect_errors({
           {"[memory]\nzero = 4\n", "r.toml:2: [memory] zero: = 4 is out of range (valid: 0 to 3)"},
           {"[memory]\nchunk_size_mb = \"big\"\n", "chunk_size_mb: = \"big\" is not a number or \"auto\""},
           {"[memory]\nchunk_size_mb = 0\n", "chunk_size_mb: = 0 is out of range"},
           {"[memory]\nchunk_size_mb = -2\n", "chunk_size_mb: = -2 is out of range"},
           {"[memory]\nchunk_size_mb = true\n", "chunk_size_mb: must be a number or \"auto\", not a boolean"},
           {"[parallel]\nbucket_mb = 25\n", "bucket_mb: was replaced by [memory] chunk_size_mb"},
           {"[data]\ntokenizer_vocab = 1\n", "tokenizer_vocab: = 1 is below the 260 pieces every trained tokenizer needs"},
  });
}

TEST(RecipeErrors, OptimizerNamesAndHyperParametersOutOfRangeNameTheKey) {
  EXPECT_EQ(parse_recipe("[optim]\nname = \"lamb\"\n", "r.toml").optim.name, "lamb");
  expect_errors({
           {"[optim]\nname = \"adam\"\n", "r.toml:2: [optim] name: = \"adam\""},
           {"[optim]\nmomentum = 1\n", "[optim] momentum: = 1 is out of range (valid: 0 to 0.999999)"},
           {"[optim]\nname = \"sgd\"\nmomentum = 0\nnesterov = true\n", "nesterov: = true needs momentum > 0"},
           {"[optim]\ntrust_coefficient = 0\n", "[optim] trust_coefficient: = 0 is out of range"},
           {"[optim]\nbetas = [0.9, 1.0]\n", "[optim] betas"},
  });
}
