// TokenizerImpl: what every tokenizer kind provides to the Tokenizer facade (tokenizer.h): encode,
// decode, its vocabulary and the tokens that play a role (end of text, padding, mask, ...).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace colossal {

class TokenizerImpl {
 public:
  virtual ~TokenizerImpl() = default;
  // `add_special`: the tokens the tokenizer's post-processor wraps a text in ("[CLS] A [SEP]").
  virtual std::vector<int> encode(std::string_view text, bool add_special) const = 0;
  // Bytes, not necessarily whole UTF-8 (a byte-level token can end inside a character).
  virtual std::string decode(const std::vector<int>& ids, bool skip_special) const = 0;
  virtual int64_t vocab_size() const = 0;   // one past the largest id
  virtual std::optional<int> id_of(std::string_view token) const = 0;
  // The token playing `role` ("eos", "bos", "pad", "unk", "sep", "cls", "mask"), if the files name one.
  virtual std::optional<int> role_id(const std::string& role) const = 0;
  virtual std::string kind() const = 0;   // "SentencePiece", "byte-level BPE", "WordPiece"
};

}  // namespace colossal
