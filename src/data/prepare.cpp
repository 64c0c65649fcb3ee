// Data preparation: see prepare.h.
#include "src/data/prepare.h"

#include <filesystem>
#include <fstream>
#include <spdlog/spdlog.h>

#include "src/core/error.h"
#include "src/core/recipe.h"
#include "src/core/text.h"
#include "src/data/token_dataset.h"
#include "src/data/tokenizer.h"
#include "src/io/atomic_dir.h"

namespace fs = std::filesystem;

namespace colossal {

namespace {

std::ifstream open_corpus(const std::string& text_path) {
  std::ifstream in(text_path, std::ios::binary);
  if (!in) throw Error("text " + text_path + ": " + (fs::exists(text_path) ? "cannot be read" : "no such file"));
  return in;
}

bool blank(const std::string& line) { return line.find_first_not_of(" \t\r") == std::string::npos; }

Error empty_corpus(const std::string& text_path) {
  return Error("text " + text_path + ": empty corpus (no documents; documents are separated by blank lines)");
}

}  // namespace

void require_corpus(const std::string& text_path) {
  std::ifstream in = open_corpus(text_path);
  std::string line;
  while (std::getline(in, line))
    if (!blank(line)) return;
  throw empty_corpus(text_path);
}

std::vector<std::string> read_documents(const std::string& text_path) {
  std::ifstream in = open_corpus(text_path);
  std::vector<std::string> docs;
  std::string line, doc;
  auto flush = [&] {
    if (!doc.empty()) docs.push_back(std::move(doc));
    doc.clear();
  };
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (blank(line)) {
      flush();
      continue;
    }
    if (!doc.empty()) doc += '\n';
    doc += line;
  }
  flush();
  if (docs.empty()) throw empty_corpus(text_path);
  return docs;
}

PrepareStats prepare_dataset(const std::string& text_path, const Tokenizer& tokenizer, const std::string& out_path,
                             double val_fraction) {
  const auto end_of_text = tokenizer.end_of_text();
  if (!end_of_text)
    throw Error("tokenizer (" + tokenizer.kind() + ") names no end-of-text token (eos_token or sep_token) to separate documents with");
  auto docs = read_documents(text_path);
  TokenSplit train, val;
  PrepareStats st;
  st.documents = static_cast<int64_t>(docs.size());
  const uint64_t threshold = static_cast<uint64_t>(val_fraction * 1e6);
  for (size_t i = 0; i < docs.size(); ++i) {
    uint64_t h = (i + 1) * 0x9E3779B97F4A7C15ULL;   // Fibonacci hashing: spreads held-out docs evenly
    bool held_out = docs.size() > 1 && (h >> 32) % 1000000 < threshold;
    (held_out ? val : train).append_document(tokenizer.encode(docs[i]), *end_of_text);
  }
  if (val_fraction > 0 && val.documents() == 0 && train.documents() > 1) {
    // Tiny corpora: hold out the last document so eval loss still exists.
    TokenSplit moved;
    int64_t start = train.doc_offsets[train.documents() - 1];
    moved.tokens.assign(train.tokens.begin() + start, train.tokens.end());
    moved.doc_offsets.push_back(static_cast<int64_t>(moved.tokens.size()));
    train.tokens.resize(start);
    train.doc_offsets.pop_back();
    val = std::move(moved);
  }
  write_token_dataset(out_path, train, val, tokenizer.vocab_size(), tokenizer.fingerprint());
  st.train_tokens = static_cast<int64_t>(train.tokens.size());
  st.val_tokens = static_cast<int64_t>(val.tokens.size());
  st.val_documents = val.documents();
  return st;
}

void check_data_sources(const Recipe& r, const std::string& tokenizer_override) {
  const std::string tok_path = tokenizer_override.empty() ? r.data.tokenizer : tokenizer_override;
  if (tok_path.empty()) throw RecipeError(r.where("data.tokenizer"), "is required (a SentencePiece model, or a model directory with tokenizer files)");
  if (r.data.dataset.empty()) throw RecipeError(r.where("data.dataset"), "is required (path of a tokenized HDF5 dataset)");
  auto need_text = [&](const std::string& what) {
    if (r.data.text.empty())
      throw RecipeError(r.where("data." + what), "file " + (what == "tokenizer" ? tok_path : r.data.dataset) +
                                                      " does not exist and [data] text is not set to build it from");
    if (!fs::is_regular_file(r.data.text))
      throw RecipeError(r.where("data.text"), "file " + r.data.text + (fs::exists(r.data.text) ? " is not a regular file" : " does not exist"));
  };
  if (!fs::exists(tok_path)) need_text("tokenizer");
  if (!fs::exists(r.data.dataset)) need_text("dataset");
}

void ensure_data(const Recipe& r, const std::string& tokenizer_override) {
  check_data_sources(r, tokenizer_override);
  const std::string tok_path = tokenizer_override.empty() ? r.data.tokenizer : tokenizer_override;
  if (!fs::exists(tok_path)) {
    prepare_output_file(tok_path, tokenizer_override.empty() ? r.where("data.tokenizer") : "tokenizer " + tok_path);
    spdlog::info("training a {}-piece BPE tokenizer on {} -> {}", r.data.tokenizer_vocab, r.data.text, tok_path);
    Tokenizer::train(r.data.text, r.data.tokenizer_vocab, tok_path);
  }
  Tokenizer tok = Tokenizer::load(tok_path);
  if (!fs::exists(r.data.dataset)) {
    prepare_output_file(r.data.dataset, r.where("data.dataset"));
    spdlog::info("tokenizing {} -> {}", r.data.text, r.data.dataset);
    auto st = prepare_dataset(r.data.text, tok, r.data.dataset, r.data.val_fraction);
    spdlog::info("dataset: {} documents, {} train tokens, {} held-out tokens ({} documents)", st.documents,
                 human_count(st.train_tokens), human_count(st.val_tokens), st.val_documents);
  }
  auto info = read_token_dataset_info(r.data.dataset);
  if (info.tokenizer_fingerprint != tok.fingerprint())
    throw RecipeError(r.where("data.dataset"), r.data.dataset + " was built with a different tokenizer than " + tok_path +
                                                   " (delete it to rebuild, or point data.tokenizer at the one it was built with)");
  if (tok.vocab_size() > r.model.vocab_size)
    throw RecipeError(r.where("model.vocab_size"), "= " + std::to_string(r.model.vocab_size) + " is smaller than the tokenizer's " +
                                                       std::to_string(tok.vocab_size()) + " pieces (" + tok_path +
                                                       "); set it to at least that");
}

}  // namespace colossal
