// TextStream decodes a few tokens a step, not the whole completion: each step's released text, the
// stop, and the finished text must be what decoding the whole completion at every step gives, for
// every tokenizer kind (SentencePiece with byte fallback, byte-level BPE, WordPiece).
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <random>
#include <tuple>

#include "src/data/tokenizer.h"
#include "src/engine/text_stream.h"
#include "tests/support/test_support.h"

namespace colossal {
namespace {

// The behaviour TextStream had when it decoded everything at each token.
struct WholeDecodeStream {
  const Tokenizer& tok;
  std::vector<std::string> stop;
  std::vector<int> ids;
  std::string emitted;
  bool stopped = false;

  size_t hold() const {
    size_t h = 0;
    for (const auto& s : stop) h = std::max(h, s.empty() ? 0 : s.size() - 1);
    return h;
  }
  std::string release(const std::string& text, bool final) {
    const size_t upto = final ? text.size() : (text.size() > hold() ? text.size() - hold() : 0);
    if (upto <= emitted.size()) return "";
    std::string piece = text.substr(emitted.size(), upto - emitted.size());
    emitted += piece;
    return piece;
  }
  std::string push(int id) {
    ids.push_back(id);
    const std::string text = stable_text(tok, ids);
    size_t cut = std::string::npos;
    for (const auto& s : stop)
      if (!s.empty()) cut = std::min(cut, text.find(s));
    if (cut == std::string::npos) return release(text, false);
    stopped = true;
    return release(text.substr(0, cut), true);
  }
};

// Streams `ids` through both, token by token, and checks every step and both ways of finishing.
void expect_same_stream(const Tokenizer& tok, const std::vector<int>& ids, const std::vector<std::string>& stop, const std::string& where) {
  TextStream stream(tok, stop);
  WholeDecodeStream reference{tok, stop};
  for (size_t i = 0; i < ids.size() && !reference.stopped; ++i) {
    const std::string got = stream.push(ids[i]), want = reference.push(ids[i]);
    ASSERT_EQ(got, want) << where << ": token " << i << " of " << ids.size();
    ASSERT_EQ(stream.stopped(), reference.stopped) << where << ": token " << i;
  }
  EXPECT_EQ(stream.emitted(), reference.emitted) << where;
  if (!reference.stopped) {
    TextStream at_length = stream;
    WholeDecodeStream reference_at_length = reference;
    const std::string before = stream.emitted();   // finishing appends to it
    EXPECT_EQ(before + stream.finish_at_eos(), before + reference.release(stable_text(tok, ids), true)) << where;
    EXPECT_EQ(before + at_length.finish_at_length(), before + reference_at_length.release(tok.decode(ids, true), true)) << where;
  }
}

// The fixture strings back to back (several scripts, emoji, malformed spacing), as one long completion,
// and random ids over the whole vocabulary (byte tokens and pieces that only make sense mid-word).
std::vector<std::vector<int>> completions(const Tokenizer& tok, const std::string& text) {
  std::vector<std::vector<int>> out{tok.encode(text)};
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> any(0, static_cast<int>(tok.vocab_size()) - 1);
  for (int k = 0; k < 2; ++k) {
    std::vector<int> ids(120);
    for (int& id : ids) id = any(rng);
    out.push_back(ids);
  }
  return out;
}

TEST(TextStream, EachStepReleasesWhatDecodingTheWholeCompletionWould) {
  const std::string common = test::read_file(test::small_corpus().text).substr(0, 600) + " Ünïcödé — 日本語のテキスト 🙂🚀 naïve café";
  std::vector<std::tuple<std::string, Tokenizer, std::string>> tokenizers{
      {"sentencepiece", Tokenizer::load(test::small_corpus().tokenizer), common}};
  for (const char* name : {"gpt2-bpe", "roberta-bpe", "opt-tiny", "bloom-tiny", "bert-uncased", "bert-cased"}) {
    std::string text = common;   // and this tokenizer's fixture strings (several scripts, emoji, odd spacing)
    for (const auto& c : test::read_json_file(test::tokenizer_fixture(name) + "/expected.json")["cases"]) text += " " + c["text"].get<std::string>();
    tokenizers.emplace_back(name, Tokenizer::load(test::tokenizer_fixture(name)), text);
  }
  for (const auto& [name, tok, text] : tokenizers) {
    const auto all = completions(tok, text);
    ASSERT_GT(all[0].size(), 150u) << name;   // long enough for the anchor to move many times
    for (size_t c = 0; c < all.size(); ++c) {
      const std::string where = name + " completion " + std::to_string(c);
      expect_same_stream(tok, all[c], {}, where);
      // Stops: ones that never occur, one deep in the text (after many anchors), and a single character.
      expect_same_stream(tok, all[c], {"ZZZQ", "the cat sat"}, where + " with stops that never occur");
      const std::string whole = tok.decode(all[c], true);
      if (whole.size() > 200) expect_same_stream(tok, all[c], {whole.substr(whole.size() * 3 / 4, 5)}, where + " stopping late");
      expect_same_stream(tok, all[c], {"e"}, where + " stopping at the first e");
    }
  }
}

}  // namespace
}  // namespace colossal
