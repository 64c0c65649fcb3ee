// Tokenizer, HDF5 dataset and window loader: round trips, determinism from a seed, rank sharding,
// restart at a position, and the errors for bad data.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <set>

#include "src/core/error.h"
#include "src/core/recipe.h"
#include "src/data/loader.h"
#include "src/data/prepare.h"
#include "src/data/token_dataset.h"
#include "src/data/tokenizer.h"
#include "tests/support/test_support.h"

using namespace colossal;
using colossal::test::error_of;
using colossal::test::small_corpus;
using colossal::test::TempDir;

namespace {

std::shared_ptr<const std::vector<int32_t>> train_tokens() {
  static auto tokens = std::make_shared<const std::vector<int32_t>>(read_token_split(small_corpus().dataset, "train").tokens);
  return tokens;
}

}  // namespace

TEST(Tokenizer, RoundTripsTextExactlyIncludingNewlinesAndUnseenCharacters) {
  auto tok = Tokenizer::load(small_corpus().tokenizer);
  EXPECT_EQ(tok.vocab_size(), 512);
  for (std::string text : {"In the beginning God created the heaven and the earth.",
                           "Line one\nLine two\n\nafter a blank line",
                           "  leading and  double  spaces ",
                           "unseen: \xC3\xA9t\xC3\xA9 \xE2\x9C\x93 \xF0\x9F\x99\x82 {}<>"}) {
    auto ids = tok.encode(text);
    EXPECT_EQ(tok.decode(ids), text);
    for (int id : ids) EXPECT_TRUE(id >= 0 && id < tok.vocab_size());
  }
}

TEST(Tokenizer, NewlineIsASinglePiece) {
  auto tok = Tokenizer::load(small_corpus().tokenizer);
  EXPECT_EQ(tok.encode("\n").size(), 1u);
}

TEST(Tokenizer, MissingOrCorruptModelIsAnError) {
  TempDir dir;
  EXPECT_NE(error_of([] { Tokenizer::load("/nonexistent/tok.model"); }).find("no such file"), std::string::npos);
  colossal::test::write_file(dir / "bad.model", "not a model");
  EXPECT_NE(error_of([&] { Tokenizer::load(dir / "bad.model"); }).find("not a SentencePiece model"), std::string::npos);
}

TEST(Dataset, HoldsEveryDocumentEndedByEosWithMatchingOffsets) {
  auto tok = Tokenizer::load(small_corpus().tokenizer);
  auto docs = read_documents(small_corpus().text);
  auto train = read_token_split(small_corpus().dataset, "train");
  auto val = read_token_split(small_corpus().dataset, "val");
  EXPECT_EQ(train.documents() + val.documents(), static_cast<int64_t>(docs.size()));
  EXPECT_GT(val.documents(), 0);
  for (const auto* split : {&train, &val}) {
    for (int64_t d = 0; d < split->documents(); ++d) {
      int64_t end = split->doc_offsets[d + 1];
      EXPECT_EQ(split->tokens[end - 1], *tok.end_of_text());
    }
  }
  // The first training document decodes back to the first chapter.
  std::vector<int> first(train.tokens.begin(), train.tokens.begin() + train.doc_offsets[1] - 1);
  EXPECT_EQ(tok.decode(first), docs[0]);
  auto info = read_token_dataset_info(small_corpus().dataset);
  EXPECT_EQ(info.vocab_size, 512);
  EXPECT_EQ(info.tokenizer_fingerprint, tok.fingerprint());
  EXPECT_EQ(info.train_tokens, static_cast<int64_t>(train.tokens.size()));
}

TEST(Dataset, EmptyCorpusIsAnError) {
  TempDir dir;
  colossal::test::write_file(dir / "empty.txt", "\n\n   \n");
  EXPECT_NE(error_of([&] { read_documents(dir / "empty.txt"); }).find("empty corpus"), std::string::npos);
  EXPECT_NE(error_of([&] { read_documents(dir / "missing.txt"); }).find("no such file"), std::string::npos);
}

TEST(Dataset, NonHdf5FileIsAnError) {
  TempDir dir;
  colossal::test::write_file(dir / "x.h5", "plain text");
  EXPECT_NE(error_of([&] { read_token_split(dir / "x.h5", "train"); }).find("not an HDF5 file"), std::string::npos);
}

TEST(Loader, SameSeedSameBatchesDifferentSeedDifferentBatches) {
  LoaderConfig c{4, 32, 7, 0, 1, 2};
  WindowLoader a(train_tokens(), c), b(train_tokens(), c);
  c.seed = 8;
  WindowLoader other(train_tokens(), c);
  bool differs = false;
  for (int i = 0; i < 10; ++i) {
    auto x = a.next(), y = b.next(), z = other.next();
    EXPECT_TRUE(at::equal(x, y));
    differs |= !at::equal(x, z);
    EXPECT_EQ(x.sizes(), (at::IntArrayRef{4, 33}));
  }
  EXPECT_TRUE(differs);
}

TEST(Loader, RestartAtPositionContinuesTheSameSequence) {
  LoaderConfig c{4, 32, 3, 0, 1, 3};
  WindowLoader full(train_tokens(), c);
  std::vector<at::Tensor> seq;
  for (int i = 0; i < 12; ++i) seq.push_back(full.next());
  WindowLoader resumed(train_tokens(), c, 5 * 4);   // positions count samples
  for (int i = 5; i < 12; ++i) EXPECT_TRUE(at::equal(resumed.next(), seq[i])) << "batch " << i;
  EXPECT_EQ(resumed.position(), 12 * 4);
}

TEST(Loader, WindowsAreTokenStreamSlicesWithShiftedTargets) {
  LoaderConfig c{2, 16, 1, 0, 1, 1};
  WindowLoader l(train_tokens(), c);
  auto b = l.next();
  const auto& toks = *train_tokens();
  for (int64_t row = 0; row < 2; ++row) {
    // Find the window in the stream: it must be a contiguous slice.
    const int64_t first = b[row][0].item<int64_t>();
    bool found = false;
    for (size_t s = 0; s + 17 <= toks.size() && !found; ++s) {
      if (toks[s] != first) continue;
      bool all = true;
      for (int64_t i = 0; i < 17 && all; ++i) all = toks[s + i] == b[row][i].item<int64_t>();
      found = all;
    }
    EXPECT_TRUE(found) << "row " << row;
  }
}

TEST(Loader, RanksTogetherSeeExactlyTheSingleProcessGlobalBatchAcrossEpochs) {
  // Token i has value i, so a window is identified by its first token.
  const int64_t seq = 32, batch = 4;
  auto stream = std::make_shared<std::vector<int32_t>>(3000);
  for (size_t i = 0; i < stream->size(); ++i) (*stream)[i] = static_cast<int32_t>(i);
  for (int64_t world : {2, 4}) {
    WindowLoader single(stream, {batch * world, seq, 11, 0, 1, 2});
    const int64_t steps = 3 * single.windows_per_epoch() / (batch * world) + 2;   // crosses epochs
    std::vector<std::unique_ptr<WindowLoader>> ranks;
    for (int64_t r = 0; r < world; ++r) ranks.push_back(std::make_unique<WindowLoader>(stream, LoaderConfig{batch, seq, 11, r, world, 2}));
    for (int64_t k = 0; k < steps; ++k) {
      auto global = single.batch(k);
      for (int64_t r = 0; r < world; ++r)
        EXPECT_TRUE(at::equal(ranks[r]->batch(k), global.narrow(0, r * batch, batch))) << "world " << world << " step " << k << " rank " << r;
      EXPECT_EQ(global[0][seq].item<int64_t>() - global[0][0].item<int64_t>(), seq);   // contiguous slice
    }
  }
}

TEST(Loader, EachEpochVisitsEveryWindowOnceInANewOrder) {
  const int64_t seq = 32;
  auto stream = std::make_shared<std::vector<int32_t>>(3000);
  for (size_t i = 0; i < stream->size(); ++i) (*stream)[i] = static_cast<int32_t>(i);
  WindowLoader l(stream, {1, seq, 5, 0, 1, 2});
  const int64_t n = l.windows_per_epoch();
  std::vector<std::vector<int64_t>> epochs(2);
  for (int64_t e = 0; e < 2; ++e)
    for (int64_t k = 0; k < n; ++k) epochs[e].push_back(l.batch(e * n + k)[0][0].item<int64_t>());
  for (const auto& ep : epochs) {
    std::set<int64_t> starts(ep.begin(), ep.end());
    EXPECT_EQ(starts.size(), static_cast<size_t>(n));   // no window twice within an epoch
    for (auto s : ep) EXPECT_EQ(s % seq, ep[0] % seq);   // one shift per epoch
  }
  EXPECT_NE(epochs[0], epochs[1]);   // reshuffled
}

TEST(Loader, ResumeWithADifferentRankCountContinuesTheGlobalStream) {
  auto stream = train_tokens();
  WindowLoader single(stream, {4, 16, 9, 0, 1, 1});
  for (int i = 0; i < 3; ++i) single.next();
  const int64_t at = single.position();   // 12 global samples
  auto expected = single.batch(3);         // the next 4 samples
  WindowLoader r0(stream, {2, 16, 9, 0, 2, 1}, at), r1(stream, {2, 16, 9, 1, 2, 1}, at);
  EXPECT_TRUE(at::equal(at::cat({r0.next(), r1.next()}), expected));
  EXPECT_EQ(r0.position(), at + 4);
}

TEST(Loader, TooFewTokensForOneBatchIsAnError) {
  auto few = std::make_shared<const std::vector<int32_t>>(100, 5);
  EXPECT_NE(error_of([&] { WindowLoader l(few, {8, 64, 0, 0, 1, 1}); }).find("too few for one batch"), std::string::npos);
}

TEST(EvalBatches, AreFixedConsecutiveWindows) {
  std::vector<int32_t> toks(1000);
  for (int i = 0; i < 1000; ++i) toks[i] = i;
  auto b = eval_batches(toks, 2, 10, 3);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[1][1][0].item<int64_t>(), 30);   // window 3 starts at token 30
  EXPECT_EQ(b[1][1][10].item<int64_t>(), 40);
}

TEST(EnsureData, DatasetFromAnotherTokenizerIsRejected) {
  TempDir dir;
  Tokenizer::train(small_corpus().text, 400, dir / "other.model");
  Recipe r = parse_recipe("[model]\nvocab_size = 512\n", "r.toml",
                          {"data.tokenizer=" + (dir / "other.model"), "data.dataset=" + small_corpus().dataset});
  std::string e = error_of([&] { ensure_data(r); });
  EXPECT_NE(e.find("was built with a different tokenizer"), std::string::npos) << e;
}

TEST(EnsureData, TokenizerLargerThanModelVocabularyIsRejected) {
  Recipe r = parse_recipe("[model]\nvocab_size = 300\n[data]\ntokenizer_vocab = 300\n", "r.toml",
                          {"data.tokenizer=" + small_corpus().tokenizer, "data.dataset=" + small_corpus().dataset});
  std::string e = error_of([&] { ensure_data(r); });
  EXPECT_NE(e.find("[model] vocab_size: = 300 is smaller than the tokenizer's 512 pieces"), std::string::npos) << e;
}

TEST(EnsureData, BuildsMissingTokenizerAndDatasetFromText) {
  TempDir dir;
  Recipe r = parse_recipe("[model]\nvocab_size = 512\n[data]\ntokenizer_vocab = 400\n", "r.toml",
                          {"data.text=" + small_corpus().text, "data.tokenizer=" + (dir / "t.model"),
                           "data.dataset=" + (dir / "d.h5")});
  ensure_data(r);
  EXPECT_EQ(Tokenizer::load(dir / "t.model").vocab_size(), 400);
  EXPECT_GT(read_token_dataset_info(dir / "d.h5").train_tokens, 1000);
}

TEST(EnsureData, MissingTextNamesTheKey) {
  Recipe r = parse_recipe("[data]\ntext = \"nope.txt\"\ntokenizer = \"/nonexistent/t.model\"\ndataset = \"/nonexistent/d.h5\"\n", "r.toml");
  std::string e = error_of([&] { ensure_data(r); });
  EXPECT_NE(e.find("r.toml:2: [data] text: file nope.txt does not exist"), std::string::npos) << e;
}
