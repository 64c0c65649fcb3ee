// RecipeSection: typed reads of one [section] of a recipe with range checks, remembering which keys
// were read so that unknown keys can be reported with a "did you mean". Only src/core uses it.
#pragma once
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "src/core/error.h"
#include "src/core/toml.h"

namespace colossal {

class RecipeSection {
 public:
  // `table` may be null (section absent: every read returns its default).
  RecipeSection(const toml::table* table, std::string file, std::string name,
                const std::set<std::string>* overridden, std::map<std::string, std::string>* locations);

  int64_t integer(const std::string& key, int64_t fallback, int64_t min, int64_t max);
  // An integer, or the one word `word` (e.g. data = "auto"), which reads as `word_value`.
  int64_t integer_or_word(const std::string& key, int64_t fallback, int64_t min, int64_t max,
                          const std::string& word, int64_t word_value);
  double real(const std::string& key, double fallback, double min, double max);
  // A number, or the one word `word` (e.g. chunk_size_mb = "auto"), which reads as `word_value`.
  double real_or_word(const std::string& key, double fallback, double min, double max, const std::string& word,
                      double word_value);
  bool boolean(const std::string& key, bool fallback);
  std::string string(const std::string& key, const std::string& fallback,
                     const std::vector<std::string>& choices = {});
  std::vector<double> reals(const std::string& key, const std::vector<double>& fallback, double min, double max);

  // "file:line: [section] key" (or "--set section.key") for errors about one key.
  std::string where(const std::string& key) const;
  [[noreturn]] void fail(const std::string& key, const std::string& message) const;
  // Rejects keys that were never read, suggesting the nearest known one.
  void finish() const;

 private:
  const toml::node* lookup(const std::string& key);
  std::string position(const std::string& key) const;   // "file:line" or "--set section.key"
  std::string type_name(const toml::node& n) const;

  const toml::table* table_;
  std::string file_, name_;
  const std::set<std::string>* overridden_;
  std::map<std::string, std::string>* locations_;
  std::vector<std::string> known_;
};

}  // namespace colossal
