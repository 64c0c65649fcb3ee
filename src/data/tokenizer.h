// Tokenizer: the one type the engine tokenizes with, whatever files it came from.
//   - a SentencePiece .model (what `colossal data tokenizer` trains: BPE, newline a piece of its own,
//     byte fallback, so any UTF-8 text round-trips exactly);
//   - a model directory as Hugging Face writes it: tokenizer.json, vocab.json + merges.txt, vocab.txt
//     or tokenizer.model, with tokenizer_config.json / special_tokens_map.json (hf_tokenizer_files.h).
// It keeps the bytes of the files it was read from, so a checkpoint stores them unchanged and the
// directory loads in transformers with the same tokenizer.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "src/data/hf_tokenizer_files.h"

namespace colossal {

class TokenizerImpl;

class Tokenizer {
 public:
  // The special ids of the SentencePiece models `train` writes.
  static constexpr int kUnk = 0, kBos = 1, kEos = 2;

  // A SentencePiece .model file, or a directory holding tokenizer files. Error naming the path and
  // what was expected if neither.
  static Tokenizer load(const std::string& path);
  // The tokenizer files of a directory, as read (empty when it has none).
  static TokenizerFiles read_files(const std::string& dir);
  // From files in memory (as read_files returns them); `label` names their directory in messages.
  static Tokenizer from_files(const TokenizerFiles& files, const std::string& label);
  static Tokenizer from_bytes(const std::string& model_bytes, const std::string& label);   // a SentencePiece model
  // Trains BPE on `text_path` (one sentence per line) and writes the model to `out_path` atomically.
  static void train(const std::string& text_path, int64_t vocab_size, const std::string& out_path);

  // `add_special`: wrap the text as the tokenizer's files say ("[CLS] ... [SEP]", OPT's leading
  // "</s>"), as transformers' tokenizer(text) does; training data is encoded without.
  std::vector<int> encode(const std::string& text, bool add_special = false) const;
  std::string decode(const std::vector<int>& ids, bool skip_special = false) const;
  int64_t vocab_size() const;
  // The token ending a document (eos, else BERT's [SEP]); what datasets separate documents with
  // and generation stops at.
  std::optional<int> end_of_text() const;
  std::optional<int> role_id(const std::string& role) const;   // "bos", "eos", "pad", "mask", ...
  std::string kind() const;
  const TokenizerFiles& files() const { return files_; }
  std::string fingerprint() const;   // stable hash of the files (ties datasets to tokenizers)

 private:
  std::shared_ptr<const TokenizerImpl> impl_;
  TokenizerFiles files_;
};

}  // namespace colossal
