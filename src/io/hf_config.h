// HfConfigReader: typed reads of a Hugging Face config.json with one-line errors naming the file, the
// key and what would be valid. Families parse their configs through it (models/<family>/*_config.cpp),
// so a malformed or hostile file reads the same way in every family.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace colossal {

class HfConfigReader {
 public:
  // `j` must be an object whose "model_type", when present, is `model_type`. `label` names the
  // family in messages ("GPT-2", "OPT").
  HfConfigReader(const nlohmann::json& j, std::string path, const std::string& model_type, std::string label);

  bool present(const char* key) const;   // there and not null
  // A whole number in [1, max]; required (the bounds keep a corrupted file from asking for exabytes).
  int64_t size(const char* key, int64_t max) const;
  // The same, optional.
  int64_t size(const char* key, int64_t fallback, int64_t max) const;
  // A whole number in [0, max] (token ids), optional.
  int64_t index(const char* key, int64_t fallback, int64_t max) const;
  // A real number in [lo, hi) (or (lo, hi) when open_lo), optional.
  double real(const char* key, double fallback, double lo, double hi, bool open_lo = false) const;
  bool flag(const char* key, bool fallback) const;
  // One of `choices`, optional.
  std::string choice(const char* key, const std::string& fallback, const std::vector<std::string>& choices) const;
  // A list whose first name is one of `choices` (HF's "architectures"), optional.
  std::string first_choice(const char* key, const std::string& fallback, const std::vector<std::string>& choices) const;
  // "id2label" (class index -> name: decimal keys, string values), null when absent or empty.
  nlohmann::json id2label() const;
  // A field this model has one setting of: absent, null, or one of `accepted`; anything else is
  // refused, since building the model without it would silently compute something else.
  void fixed(const char* key, const std::vector<nlohmann::json>& accepted, const std::string& supported) const;
  [[noreturn]] void fail(const std::string& message) const;   // "<path>: <message>"

 private:
  const nlohmann::json& j_;
  std::string path_, label_;
};

// Writes "id2label" and "label2id" for `num_labels` classes into `config`: `id2label`'s names when it
// holds that many, else transformers' LABEL_i.
void write_labels(nlohmann::json& config, const nlohmann::json& id2label, int64_t num_labels);

}  // namespace colossal
