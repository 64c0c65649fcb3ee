// HfTokenizer: Hugging Face's tokenization pipeline for the kinds our model families use, built from
// the files a model directory holds (hf_tokenizer_files.cpp reads them):
//   added tokens   cut out of the text first (special tokens such as "</s>" or "[MASK]" typed into
//                  it are single ids), honouring lstrip/rstrip/single_word
//   normalizer     none, or BERT's (clean, CJK spacing, accents, lowercase)
//   pre-tokenizer  byte-level (GPT-2's word pattern, optional prefix space) or BERT's
//   model          BPE (byte-level) or WordPiece
//   post-processor the single-sequence template: ids before and after the text ("[CLS] $A [SEP]")
//   decoder        byte-level or WordPiece
#pragma once
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "src/data/bpe_model.h"
#include "src/data/tokenizer_impl.h"
#include "src/data/wordpiece.h"

namespace colossal {

struct AddedToken {
  std::string content;
  int id = 0;
  bool special = false;
  bool lstrip = false, rstrip = false;   // the match takes the whitespace on its left / right
  bool single_word = false;              // matches only as a whole word
};

struct HfTokenizerSpec {
  std::vector<AddedToken> added;
  std::optional<BertNormalizer> normalizer;
  enum class Split { byte_level, bert } split = Split::byte_level;
  bool add_prefix_space = false;   // byte-level: a space before text that lacks one
  bool use_regex = true;           // byte-level: cut words with GPT-2's pattern (else one word)
  bool bloom_split = false;        // byte-level: cut words with BLOOM's Split pattern first
  std::shared_ptr<const BpeModel> bpe;             // exactly one of these two
  std::shared_ptr<const WordPieceModel> wordpiece;
  std::vector<int> template_before, template_after;   // post-processor, single sequence
  bool wordpiece_cleanup = true;     // WordPiece decoder's own cleanup
  bool cleanup_spaces = false;       // transformers' clean_up_tokenization_spaces (WordPiece only)
  std::map<std::string, std::string> roles;   // "eos" -> "</s>", from tokenizer_config.json
};

class HfTokenizer : public TokenizerImpl {
 public:
  explicit HfTokenizer(HfTokenizerSpec spec);
  std::vector<int> encode(std::string_view text, bool add_special) const override;
  std::string decode(const std::vector<int>& ids, bool skip_special) const override;
  int64_t vocab_size() const override;
  std::optional<int> id_of(std::string_view token) const override;
  std::optional<int> role_id(const std::string& role) const override;
  std::string kind() const override { return spec_.bpe ? "byte-level BPE" : "WordPiece"; }

 private:
  void encode_plain(std::string_view text, std::vector<int>& out) const;   // text holding no added token
  const std::string* token_of(int id) const;
  const Vocab& vocab() const { return spec_.bpe ? spec_.bpe->vocab() : spec_.wordpiece->vocab(); }

  HfTokenizerSpec spec_;
  std::map<int, const AddedToken*> added_by_id_;
  std::vector<std::vector<const AddedToken*>> added_by_first_byte_;   // longest first
};

}  // namespace colossal
