// SentencePiece wrapper: see tokenizer.h.
#include "src/data/tokenizer.h"

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

}  // namespace

Tokenizer Tokenizer::from_bytes(const std::string& model_bytes, const std::string& label) {
  Tokenizer t;
  t.sp_ = std::make_shared<sentencepiece::SentencePieceProcessor>();
  auto status = t.sp_->LoadFromSerializedProto(model_bytes);
  if (!status.ok()) throw Error("tokenizer " + label + ": not a SentencePiece model (" + status.ToString() + ")");
  t.bytes_ = model_bytes;
  return t;
}

Tokenizer Tokenizer::load(const std::string& path) {
  if (!std::filesystem::is_regular_file(path))
    throw Error("tokenizer " + path + ": no such file (build one with `colossal data tokenizer`)");
  return from_bytes(read_text_file(path), path);
}

void Tokenizer::train(const std::string& text_path, int64_t vocab_size, const std::string& out_path) {
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
      {"unk_id", std::to_string(kUnk)},
      {"bos_id", std::to_string(kBos)},
      {"eos_id", std::to_string(kEos)},
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

std::vector<int> Tokenizer::encode(const std::string& text) const {
  std::vector<int> ids;
  auto status = sp_->Encode(text, &ids);
  if (!status.ok()) throw Error("tokenizer: cannot encode text: " + status.ToString());
  return ids;
}

std::string Tokenizer::decode(const std::vector<int>& ids) const {
  std::string text;
  auto status = sp_->Decode(ids, &text);
  if (!status.ok()) throw Error("tokenizer: cannot decode ids: " + status.ToString());
  return text;
}

int64_t Tokenizer::vocab_size() const { return sp_->GetPieceSize(); }

std::string Tokenizer::fingerprint() const {
  // FNV-1a over the model bytes: stable across runs and machines (std::hash is not).
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : bytes_) h = (h ^ c) * 1099511628211ULL;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

}  // namespace colossal
