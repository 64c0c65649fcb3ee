// Tokenizer: a SentencePiece BPE model. Newlines are a piece of their own and unknown characters
// fall back to bytes, so any UTF-8 text round-trips exactly through encode/decode.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace sentencepiece { class SentencePieceProcessor; }

namespace colossal {

class Tokenizer {
 public:
  static constexpr int kUnk = 0, kBos = 1, kEos = 2;

  // Loads a .model file; Error naming the path if it is missing or not a SentencePiece model.
  static Tokenizer load(const std::string& path);
  static Tokenizer from_bytes(const std::string& model_bytes, const std::string& label);
  // Trains BPE on `text_path` (one sentence per line) and writes the model to `out_path` atomically.
  static void train(const std::string& text_path, int64_t vocab_size, const std::string& out_path);

  std::vector<int> encode(const std::string& text) const;
  std::string decode(const std::vector<int>& ids) const;
  int64_t vocab_size() const;
  const std::string& model_bytes() const { return bytes_; }
  std::string fingerprint() const;   // stable hash of the model bytes (ties datasets to tokenizers)

 private:
  std::shared_ptr<sentencepiece::SentencePieceProcessor> sp_;
  std::string bytes_;
};

}  // namespace colossal
