// SentencePiece models: see sentencepiece_tokenizer.h.
#include "src/data/sentencepiece_tokenizer.h"

#include <unistd.h>

#include <filesystem>
#include <regex>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>
#include <unordered_map>

#include "src/core/error.h"
#include "src/data/prepare.h"
#include "src/io/atomic_dir.h"

namespace colossal {
namespace {

// SentencePiece's trainer reports with its source position ("./src/trainer_interface.cc(580) [...]
// Vocabulary size is smaller than required_chars. 300 vs 341."): say what it means for --vocab
// instead, and keep only the sentence otherwise.
std::string explain_trainer_error(std::string message, int64_t vocab_size) {
  static const std::regex kPrefix(R"(^[^ ]*\.cc\(\d+\) \[[^\]]*\] *)");
  message = std::regex_replace(message, kPrefix, "");
  std::smatch m;
  static const std::regex kTooSmall(R"(smaller than required_chars\. *(\d+) vs (\d+))");
  if (std::regex_search(message, m, kTooSmall))
    return "a vocabulary of " + std::to_string(vocab_size) + " is below the " + m[2].str() +
           " pieces this text needs (256 byte pieces, 3 special ones and one per distinct character); use at least " + m[2].str();
  static const std::regex kTooLarge(R"(Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+))");
  if (std::regex_search(message, m, kTooLarge))
    return "a vocabulary of " + std::to_string(vocab_size) + " is more than this text supports (at most " + m[2].str() + ")";
  return message;
}

class SentencePieceTokenizer : public TokenizerImpl {
 public:
  SentencePieceTokenizer(const std::string& bytes, const std::string& label, bool add_bos) : add_bos_(add_bos) {
    auto status = sp_.LoadFromSerializedProto(bytes);
    if (!status.ok()) throw Error("tokenizer " + label + ": not a SentencePiece model (" + status.ToString() + ")");
  }
  std::vector<int> encode(std::string_view text, bool add_special) const override {
    std::vector<int> ids;
    if (add_special && add_bos_ && sp_.bos_id() >= 0) ids.push_back(sp_.bos_id());
    std::vector<int> body;
    auto status = sp_.Encode(text, &body);
    if (!status.ok()) throw Error("tokenizer: cannot encode text: " + status.ToString());
    ids.insert(ids.end(), body.begin(), body.end());
    return ids;
  }
  std::string decode(const std::vector<int>& ids, bool skip_special) const override {
    std::vector<int> valid;   // ids outside the vocabulary are skipped (SentencePiece would refuse the whole call)
    for (int id : ids)
      if (id >= 0 && id < sp_.GetPieceSize()) valid.push_back(id);
    std::string text;
    auto status = sp_.Decode(valid, &text);   // control pieces (bos, eos) decode to nothing either way
    if (!status.ok()) throw Error("tokenizer: cannot decode ids: " + status.ToString());
    return text;
  }
  int64_t vocab_size() const override { return sp_.GetPieceSize(); }
  std::optional<int> id_of(std::string_view token) const override {
    const int id = sp_.PieceToId(token);
    if (id == sp_.unk_id() && token != sp_.IdToPiece(id)) return std::nullopt;
    return id;
  }
  std::optional<int> role_id(const std::string& role) const override {
    const int id = role == "eos" ? sp_.eos_id() : role == "bos" ? sp_.bos_id() : role == "unk" ? sp_.unk_id() : role == "pad" ? sp_.pad_id() : -1;
    if (id < 0) return std::nullopt;
    return id;
  }
  std::string kind() const override { return "SentencePiece"; }

 private:
  sentencepiece::SentencePieceProcessor sp_;
  bool add_bos_;
};

}  // namespace

std::shared_ptr<const TokenizerImpl> sentencepiece_tokenizer(const std::string& model_bytes, const std::string& label, bool add_bos) {
  return std::make_shared<SentencePieceTokenizer>(model_bytes, label, add_bos);
}

void train_sentencepiece(const std::string& text_path, int64_t vocab_size, const std::string& out_path) {
  require_corpus(text_path);   // SentencePiece's own message for these is an internal assertion
  prepare_output_file(out_path, "tokenizer output");
  std::string prefix = out_path + ".training-" + std::to_string(::getpid());
  // Identity normalisation and no whitespace folding keep the text exactly as written; the newline
  // piece lets documents keep their line structure; byte fallback makes every input encodable.
  std::unordered_map<std::string, std::string> args{
      {"input", text_path},
      {"model_prefix", prefix},
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(vocab_size)},
      {"character_coverage", "1.0"},
      {"byte_fallback", "true"},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"add_dummy_prefix", "false"},
      {"split_digits", "true"},
      {"user_defined_symbols", "\n"},
      {"unk_id", "0"},
      {"bos_id", "1"},
      {"eos_id", "2"},
      {"pad_id", "-1"},
      {"input_sentence_size", "2000000"},
      {"shuffle_input_sentence", "true"},
      {"num_threads", "2"},
      {"minloglevel", "2"},
  };
  auto status = sentencepiece::SentencePieceTrainer::Train(args);
  std::error_code ec;
  std::filesystem::remove(prefix + ".vocab", ec);
  if (!status.ok()) {
    std::filesystem::remove(prefix + ".model", ec);
    throw Error("tokenizer training on " + text_path + " failed: " + explain_trainer_error(status.message(), vocab_size));
  }
  if (const std::string reason = move_into_place(prefix + ".model", out_path); !reason.empty())
    throw Error("cannot move tokenizer to " + out_path + ": " + reason);
}

}  // namespace colossal
