// The Tokenizer facade: see tokenizer.h.
#include "src/data/tokenizer.h"

#include <cstdio>
#include <filesystem>

#include "src/core/error.h"
#include "src/core/text.h"
#include "src/data/sentencepiece_tokenizer.h"
#include "src/io/atomic_dir.h"
#include "src/data/tokenizer_impl.h"

namespace fs = std::filesystem;

namespace colossal {
namespace {

// Every file a model directory's tokenizer can consist of; what checkpoints copy.
const char* const kTokenizerFiles[] = {"tokenizer.json",  "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                                       "vocab.json",      "merges.txt",            "vocab.txt",               "tokenizer.model"};

uint64_t fnv1a(uint64_t h, const std::string& bytes) {
  for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ULL;
  return h;
}

}  // namespace

TokenizerFiles Tokenizer::read_files(const std::string& dir) {
  TokenizerFiles files;
  for (const char* name : kTokenizerFiles)
    if (const fs::path p = fs::path(dir) / name; fs::is_regular_file(p)) files[name] = read_text_file(p.string());
  return files;
}

Tokenizer Tokenizer::from_files(const TokenizerFiles& files, const std::string& label) {
  Tokenizer t;
  t.files_ = files;
  t.impl_ = hf_tokenizer_from_files(files, label);
  if (!t.impl_ && files.count("tokenizer.model")) {
    bool add_bos = false;   // SentencePiece models of HF directories (Llama's) say whether text starts with BOS
    if (auto it = files.find("tokenizer_config.json"); it != files.end()) {
      const auto config = nlohmann::json::parse(it->second, nullptr, false);
      const auto flag = config.is_object() ? config.value("add_bos_token", nlohmann::json(false)) : nlohmann::json(false);
      add_bos = flag.is_boolean() && flag.get<bool>();
    }
    t.impl_ = sentencepiece_tokenizer(files.at("tokenizer.model"), label + "/tokenizer.model", add_bos);
  }
  if (!t.impl_)
    throw Error("tokenizer " + label + ": no tokenizer files (expected tokenizer.json, vocab.json + merges.txt, vocab.txt or tokenizer.model)");
  return t;
}

Tokenizer Tokenizer::from_bytes(const std::string& model_bytes, const std::string& label) {
  Tokenizer t;
  t.impl_ = sentencepiece_tokenizer(model_bytes, label, false);
  t.files_ = {{"tokenizer.model", model_bytes}};
  return t;
}

Tokenizer Tokenizer::load(const std::string& path) {
  if (fs::is_directory(path)) return from_files(read_files(path), path);
  if (!fs::is_regular_file(path))
    throw Error("tokenizer " + path + ": no such file or directory (build one with `colossal data tokenizer`, or name a model directory)");
  return from_bytes(read_text_file(path), path);
}

void Tokenizer::train(const std::string& text_path, int64_t vocab_size, const std::string& out_path) {
  train_sentencepiece(text_path, vocab_size, out_path);
}

std::vector<int> Tokenizer::encode(const std::string& text, bool add_special) const { return impl_->encode(text, add_special); }

std::string Tokenizer::decode(const std::vector<int>& ids, bool skip_special) const { return impl_->decode(ids, skip_special); }

int64_t Tokenizer::vocab_size() const { return impl_->vocab_size(); }

std::optional<int> Tokenizer::end_of_text() const {
  if (auto eos = impl_->role_id("eos")) return eos;
  return impl_->role_id("sep");
}

std::optional<int> Tokenizer::role_id(const std::string& role) const { return impl_->role_id(role); }

std::string Tokenizer::kind() const { return impl_->kind(); }

std::string Tokenizer::fingerprint() const {
  // FNV-1a: stable across runs and machines (std::hash is not). A lone SentencePiece model hashes
  // its bytes alone, as datasets built before model directories were read recorded it.
  uint64_t h = 1469598103934665603ULL;
  if (files_.size() == 1 && files_.count("tokenizer.model")) {
    h = fnv1a(h, files_.begin()->second);
  } else {
    for (const auto& [name, bytes] : files_) h = fnv1a(fnv1a(h, name + '\0'), bytes + '\0');
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

}  // namespace colossal
