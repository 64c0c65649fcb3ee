// Hugging Face tokenizers against transformers: the ids of every fixture string, with and without the
// special tokens, and their decodes (scripts/fixtures/make_tokenizers.py wrote expected.json from
// transformers 5.24 / tokenizers 0.23) for byte-level BPE from tokenizer.json and from vocab.json +
// merges.txt, RoBERTa-style BPE, and WordPiece from tokenizer.json and from vocab.txt; byte-level
// round trips of any bytes; the errors broken files give.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "src/data/byte_level.h"
#include "src/data/tokenizer.h"
#include "src/data/unicode.h"
#include "tests/support/test_support.h"

using namespace colossal;
namespace fs = std::filesystem;

namespace {

nlohmann::json expected(const std::string& name) { return test::read_json_file(test::tokenizer_fixture(name) + "/expected.json"); }

std::string shown(const std::string& s) { return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

class HfTokenizerFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(HfTokenizerFixture, IdsMatchTransformersOnEveryFixtureString) {
  const auto tok = Tokenizer::load(test::tokenizer_fixture(GetParam()));
  const auto ref = expected(GetParam());
  EXPECT_EQ(tok.vocab_size(), ref["vocab_size"].get<int64_t>());
  for (const auto& c : ref["cases"]) {
    const std::string text = c["text"];
    EXPECT_EQ(tok.encode(text), c["ids"].get<std::vector<int>>()) << shown(text);
    EXPECT_EQ(tok.encode(text, true), c["ids_with_special"].get<std::vector<int>>()) << shown(text);
  }
}

TEST_P(HfTokenizerFixture, DecodesAsTransformersDoes) {
  const auto tok = Tokenizer::load(test::tokenizer_fixture(GetParam()));
  const auto cases = expected(GetParam())["cases"];   // kept: a range-for over a temporary's member dangles
  for (const auto& c : cases) {
    const auto ids = c["ids"].get<std::vector<int>>(), with_special = c["ids_with_special"].get<std::vector<int>>();
    EXPECT_EQ(tok.decode(ids), c["decoded"].get<std::string>()) << shown(c["text"]);
    EXPECT_EQ(tok.decode(with_special), c["decoded_with_special"].get<std::string>()) << shown(c["text"]);
    EXPECT_EQ(tok.decode(with_special, true), c["decoded_skip_special"].get<std::string>()) << shown(c["text"]);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HfTokenizerFixture,
                         ::testing::Values("gpt2-bpe", "gpt2-bpe-files", "roberta-bpe", "opt-tiny", "bloom-tiny", "bert-uncased",
                                           "bert-uncased-vocab", "bert-cased"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

TEST(ByteLevelBpe, EveryFixtureStringDecodesBackExactly) {
  for (const char* name : {"gpt2-bpe", "gpt2-bpe-files", "opt-tiny", "bloom-tiny"}) {
    const auto tok = Tokenizer::load(test::tokenizer_fixture(name));
    const auto cases = expected(name)["cases"];
    for (const auto& c : cases) EXPECT_EQ(tok.decode(tok.encode(c["text"])), c["text"].get<std::string>()) << name;
  }
}

TEST(ByteLevelBpe, AnyBytesRoundTripIncludingMalformedUtf8) {
  const auto tok = Tokenizer::load(test::tokenizer_fixture("gpt2-bpe"));
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::string s(static_cast<size_t>(rng() % 64), '\0');
    for (char& ch : s) ch = static_cast<char>(rng() % 256);
    EXPECT_EQ(tok.decode(tok.encode(s)), s);
  }
}

TEST(ByteLevelBpe, AVeryLongWordEncodesAndRoundTrips) {
  const auto tok = Tokenizer::load(test::tokenizer_fixture("gpt2-bpe"));
  const std::string word(200000, 'a');   // one pre-token: the merge heap keeps this O(n log n)
  EXPECT_EQ(tok.decode(tok.encode(word)), word);
}

TEST(ByteLevel, SplitsWordsAsGpt2sPattern) {
  auto words = [](const std::string& s) {
    std::vector<std::string> out;
    for (auto w : byte_level::split_words(s)) out.emplace_back(w);
    return out;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(words("Hello world"), (V{"Hello", " world"}));
  EXPECT_EQ(words("a   b"), (V{"a", "  ", " b"}));           // a space run gives its last space to the next word
  EXPECT_EQ(words("end  "), (V{"end", "  "}));               // ... except at the end of the text
  EXPECT_EQ(words("x\n\ny"), (V{"x", "\n", "\n", "y"}));     // only ' ' joins a word
  EXPECT_EQ(words("I'm they'll 'quoted'"), (V{"I", "'m", " they", "'ll", " '", "quoted", "'"}));
  EXPECT_EQ(words("3.14 ½"), (V{"3", ".", "14", " ½"}));
  EXPECT_EQ(words("naïve 你好!!"), (V{"naïve", " 你好", "!!"}));
}

TEST(Unicode, ClassesAndMappingsAgreeWithTheStandard) {
  EXPECT_TRUE(unicode::is_letter(U'ß'));
  EXPECT_TRUE(unicode::is_letter(U'你'));
  EXPECT_TRUE(unicode::is_number(U'½'));
  EXPECT_TRUE(unicode::is_number(U'Ⅻ'));
  EXPECT_TRUE(unicode::is_punctuation(U'$'));   // BERT's ASCII rule
  EXPECT_TRUE(unicode::is_punctuation(U'«'));
  EXPECT_TRUE(unicode::is_whitespace(U'\u3000'));
  EXPECT_FALSE(unicode::is_whitespace(U'\u200b'));
  EXPECT_EQ(unicode::char_class(U'\u0301'), unicode::CharClass::nonspacing_mark);
  EXPECT_EQ(unicode::char_class(U'\u00ad'), unicode::CharClass::control);   // Cf
  std::u32string out;
  unicode::append_lowercase(out, U'\u0130');   // İ -> i + combining dot
  EXPECT_EQ(out, U"i\u0307");
  out.clear();
  unicode::append_decomposition(out, U'\u1EA5');   // ấ -> a + circumflex + acute
  EXPECT_EQ(out, U"a\u0302\u0301");
  out.clear();
  unicode::append_decomposition(out, U'한');
  EXPECT_EQ(out, U"\u1112\u1161\u11AB");
  EXPECT_EQ(unicode::decode("\xC0\x80"), U"\uFFFD\uFFFD");   // overlong: two malformed bytes
}

TEST(HfTokenizer, ReportsTheRolesOfSpecialTokens) {
  const auto opt = Tokenizer::load(test::tokenizer_fixture("opt-tiny"));
  EXPECT_EQ(opt.end_of_text(), 2);
  EXPECT_EQ(opt.role_id("pad"), 1);
  const auto bert = Tokenizer::load(test::tokenizer_fixture("bert-uncased"));
  EXPECT_EQ(bert.end_of_text(), 3);   // [SEP]: BERT has no eos
  EXPECT_EQ(bert.role_id("mask"), 4);
  EXPECT_EQ(bert.kind(), "WordPiece");
  EXPECT_EQ(Tokenizer::load(test::tokenizer_fixture("gpt2-bpe")).end_of_text(), 0);   // <|endoftext|>
}

TEST(HfTokenizer, KeepsTheFilesItWasReadFrom) {
  const auto tok = Tokenizer::load(test::tokenizer_fixture("bert-uncased"));
  std::vector<std::string> names;
  for (const auto& [name, bytes] : tok.files()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"tokenizer.json", "tokenizer_config.json", "vocab.txt"}));
  EXPECT_EQ(tok.files().at("vocab.txt"), test::read_file(test::tokenizer_fixture("bert-uncased") + "/vocab.txt"));
  EXPECT_NE(tok.fingerprint(), Tokenizer::load(test::tokenizer_fixture("bert-cased")).fingerprint());
}

std::string load_error(const std::string& dir) { return test::error_of([&] { Tokenizer::load(dir); }); }

class HfTokenizerErrors : public ::testing::Test {
 protected:
  // A directory holding gpt2-bpe's tokenizer.json after `edit`; the error loading it.
  std::string with_tokenizer_json(const std::function<void(nlohmann::json&)>& edit) {
    auto j = nlohmann::json::parse(test::read_file(test::tokenizer_fixture("gpt2-bpe") + "/tokenizer.json"));
    edit(j);
    return with_file("gpt2-bpe", "tokenizer.json", j.dump());
  }
  // A copy of fixture `name` with `file` replaced by `content`; the error loading it.
  std::string with_file(const std::string& name, const std::string& file, const std::string& content) {
    const std::string dir = tmp_ / ("case" + std::to_string(cases_++));
    fs::copy(test::tokenizer_fixture(name), dir);
    test::write_file(dir + "/" + file, content);
    return load_error(dir);
  }
  test::TempDir tmp_;
  int cases_ = 0;
};

#define EXPECT_HAS(haystack, needle) EXPECT_NE((haystack).find(needle), std::string::npos) << (haystack)

TEST_F(HfTokenizerErrors, MalformedJsonNamesTheFileAndByte) {
  const auto e = with_file("gpt2-bpe", "tokenizer.json", "{\"model\": [1, 2");
  EXPECT_HAS(e, "tokenizer.json");
  EXPECT_HAS(e, "not valid JSON");
}

TEST_F(HfTokenizerErrors, AMergeOutsideTheVocabularyIsNamed) {
  const auto e = with_tokenizer_json([](auto& j) { j["model"]["merges"][0] = "zz qq"; });
  EXPECT_HAS(e, "tokenizer.json: merge 1 (\"zz qq\") needs the token \"zz\", which is not in the vocabulary");
}

TEST_F(HfTokenizerErrors, UnsupportedPiecesSayWhatIsSupported) {
  EXPECT_HAS(with_tokenizer_json([](auto& j) { j["model"]["type"] = "Unigram"; }), "model.type = \"Unigram\" is not supported");
  EXPECT_HAS(with_tokenizer_json([](auto& j) { j["pre_tokenizer"] = {{"type", "Metaspace"}}; }), "pre_tokenizer is Metaspace");
  EXPECT_HAS(with_tokenizer_json([](auto& j) { j["normalizer"] = {{"type", "NFKC"}}; }), "normalizer.type = \"NFKC\" is not supported");
  EXPECT_HAS(with_tokenizer_json([](auto& j) { j["model"]["dropout"] = 0.1; }), "model.dropout = 0.1 is not supported");
}

TEST_F(HfTokenizerErrors, WrongTypesNameTheField) {
  EXPECT_HAS(with_tokenizer_json([](auto& j) { j["model"]["vocab"]["a"] = "x"; }), "model.vocab[\"a\"] = \"x\" (expected a token id");
  EXPECT_HAS(with_tokenizer_json([](auto& j) { j["added_tokens"] = 3; }), "added_tokens = 3 (expected an array)");
  EXPECT_HAS(with_tokenizer_json([](auto& j) { j["model"]["merges"] = "x"; }), "model.merges = \"x\" (expected an array)");
  EXPECT_HAS(with_tokenizer_json([](auto& j) { j["model"]["vocab"]["a"] = -1; }), "(expected a token id in [0, ");
  EXPECT_HAS(with_tokenizer_json([](auto& j) { j.erase("model"); }), "tokenizer.json: model is missing");
  EXPECT_HAS(with_tokenizer_json([](auto& j) { j = nlohmann::json::array(); }), "holds array, not a JSON object");
}

TEST_F(HfTokenizerErrors, ATemplateTokenOutsideTheVocabularyIsNamed) {
  const auto e = with_tokenizer_json([](auto& j) {
    j["post_processor"] = {{"type", "TemplateProcessing"},
                           {"single", {{{"SpecialToken", {{"id", "<nope>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
                           {"special_tokens", nlohmann::json::object()}};
  });
  EXPECT_HAS(e, "post_processor.single[0] names \"<nope>\", which is not in the vocabulary");
}

TEST_F(HfTokenizerErrors, OlderFilesNameTheirLine) {
  EXPECT_HAS(with_file("gpt2-bpe-files", "merges.txt", "#version: 0.2\nt h\nbroken\n"), "merges.txt: line 3 = \"broken\" (expected two tokens");
  EXPECT_HAS(with_file("bert-uncased-vocab", "vocab.txt", "a\nb\n"), "vocab.txt: the unknown token \"[UNK]\" is not in the vocabulary");
  EXPECT_HAS(with_file("gpt2-bpe-files", "vocab.json", "[]"), "vocab.json: holds array, not a JSON object");
}

TEST_F(HfTokenizerErrors, ADirectoryWithoutTokenizerFilesSaysWhatWasExpected) {
  EXPECT_HAS(load_error(tmp_.path()), "no tokenizer files (expected tokenizer.json, vocab.json + merges.txt, vocab.txt or tokenizer.model)");
  EXPECT_HAS(load_error(tmp_ / "absent"), "no such file or directory");
}

}  // namespace
