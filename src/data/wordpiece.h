// BERT's text pipeline, as Hugging Face's BertNormalizer, BertPreTokenizer and WordPiece model do it:
// clean the text (drop control characters, whitespace becomes ' '), put spaces around CJK ideographs,
// strip accents (canonical decomposition, nonspacing marks dropped) and lowercase, character by
// character; cut words at whitespace and around every punctuation character; then split each word
// greedily into the longest vocabulary pieces, continuations spelled with a "##" prefix.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "src/data/vocab.h"

namespace colossal {

struct BertNormalizer {
  bool clean_text = true;
  bool handle_chinese_chars = true;
  std::optional<bool> strip_accents;   // unset: follows lowercase, as in BERT
  bool lowercase = true;
  std::string apply(std::string_view text) const;
};

// Words of normalized text: whitespace removed, each punctuation character a word of its own.
std::vector<std::string_view> bert_words(std::string_view text);

class WordPieceModel {
 public:
  WordPieceModel(std::unordered_map<std::string, int> vocab, std::string unk_token, std::string prefix,
                 int64_t max_input_chars_per_word, const std::string& where);
  void encode_word(std::string_view word, std::vector<int>& out) const;
  const Vocab& vocab() const { return vocab_; }
  const std::string& prefix() const { return prefix_; }

 private:
  Vocab vocab_;
  std::string prefix_;
  int64_t max_chars_;
  int unk_;
};

// WordPiece's decoder: every piece but the first gets a leading space, or loses its "##" prefix (a
// continuation glues on); with `cleanup`, each piece then goes through cleanup_tokenization_spaces.
std::string wordpiece_join(const std::vector<std::string>& tokens, const std::string& prefix, bool cleanup);
// Removes the spaces BERT-style tokenization puts before punctuation and contractions (" ." -> ".",
// " n't" -> "n't"), as transformers' clean_up_tokenization does.
std::string cleanup_tokenization_spaces(std::string text);

}  // namespace colossal
