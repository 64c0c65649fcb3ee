// RecipeSection: see recipe_table.h.
#include "src/core/recipe_table.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "src/core/text.h"

namespace colossal {

RecipeSection::RecipeSection(const toml::table* table, std::string file, std::string name,
                             const std::set<std::string>* overridden,
                             std::map<std::string, std::string>* locations)
    : table_(table), file_(std::move(file)), name_(std::move(name)), overridden_(overridden),
      locations_(locations) {}

std::string RecipeSection::position(const std::string& key) const {
  std::string dotted = name_.empty() ? key : name_ + "." + key;
  if (overridden_ && overridden_->count(dotted)) return "--set " + dotted;
  const toml::node* n = table_ ? table_->get(key) : nullptr;
  if (n && n->source().begin.line > 0) return file_ + ":" + std::to_string(n->source().begin.line);
  if (table_ && table_->source().begin.line > 0)
    return file_ + ":" + std::to_string(table_->source().begin.line);
  return file_;
}

std::string RecipeSection::where(const std::string& key) const {
  std::string p = position(key);
  if (p.rfind("--set ", 0) == 0) return p;
  return p + ": " + (name_.empty() ? key : "[" + name_ + "] " + key);
}

void RecipeSection::fail(const std::string& key, const std::string& message) const {
  throw RecipeError(where(key), message);
}

const toml::node* RecipeSection::lookup(const std::string& key) {
  known_.push_back(key);
  const toml::node* n = table_ ? table_->get(key) : nullptr;
  if (n && locations_) locations_->emplace(name_.empty() ? key : name_ + "." + key, where(key));
  return n;
}

std::string RecipeSection::type_name(const toml::node& n) const {
  switch (n.type()) {
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a number";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::array: return "an array";
    case toml::node_type::table: return "a table";
    default: return "a date/time";
  }
}

int64_t RecipeSection::integer(const std::string& key, int64_t fallback, int64_t min, int64_t max) {
  const toml::node* n = lookup(key);
  if (!n) return fallback;
  auto v = n->value_exact<int64_t>();
  if (!v) {
    auto f = n->value_exact<double>();
    if (f && std::floor(*f) == *f) fail(key, "must be an integer, not " + format_number(*f) + " (write it without a decimal point)");
    fail(key, "must be an integer, not " + type_name(*n));
  }
  if (*v < min || *v > max)
    fail(key, "= " + std::to_string(*v) + " is out of range (valid: " + std::to_string(min) + " to " +
                  (max == INT64_MAX ? std::string("any larger value") : std::to_string(max)) + ")");
  return *v;
}

int64_t RecipeSection::integer_or_word(const std::string& key, int64_t fallback, int64_t min, int64_t max,
                                       const std::string& word, int64_t word_value) {
  const toml::node* n = lookup(key);
  if (n && n->is_string()) {
    if (n->value_exact<std::string>() != word)
      fail(key, "= \"" + *n->value_exact<std::string>() + "\" is not an integer or \"" + word + "\"");
    return word_value;
  }
  if (n && !n->is_integer())
    fail(key, "must be an integer or \"" + word + "\", not " + type_name(*n));
  return integer(key, fallback, min, max);
}

double RecipeSection::real_or_word(const std::string& key, double fallback, double min, double max, const std::string& word,
                                   double word_value) {
  const toml::node* n = lookup(key);
  if (n && n->is_string()) {
    if (n->value_exact<std::string>() != word)
      fail(key, "= \"" + *n->value_exact<std::string>() + "\" is not a number or \"" + word + "\"");
    return word_value;
  }
  if (n && (n->is_boolean() || !n->value<double>()))
    fail(key, "must be a number or \"" + word + "\", not " + type_name(*n));
  return real(key, fallback, min, max);
}

double RecipeSection::real(const std::string& key, double fallback, double min, double max) {
  const toml::node* n = lookup(key);
  if (!n) return fallback;
  auto v = n->value<double>();   // integers convert
  if (!v || n->is_boolean() || n->is_string()) fail(key, "must be a number, not " + type_name(*n));
  if (!std::isfinite(*v) || *v < min || *v > max)
    fail(key, "= " + format_number(*v) + " is out of range (valid: " + format_number(min) + " to " +
                  (max >= std::numeric_limits<double>::max() ? std::string("any larger value") : format_number(max)) + ")");
  return *v;
}

bool RecipeSection::boolean(const std::string& key, bool fallback) {
  const toml::node* n = lookup(key);
  if (!n) return fallback;
  auto v = n->value_exact<bool>();
  if (!v) fail(key, "must be true or false, not " + type_name(*n));
  return *v;
}

std::string RecipeSection::string(const std::string& key, const std::string& fallback,
                                  const std::vector<std::string>& choices) {
  const toml::node* n = lookup(key);
  if (!n) return fallback;
  auto v = n->value_exact<std::string>();
  if (!v) fail(key, "must be a string, not " + type_name(*n));
  // Control characters (a NUL would silently cut a path short, a newline splits log lines) are never
  // part of a name or path a recipe means.
  if (const size_t i = control_char_at(*v); i != std::string::npos)
    fail(key, "contains a control character (byte " + std::to_string(static_cast<unsigned char>((*v)[i])) + " at offset " +
                  std::to_string(i) + "); names and paths are plain text");
  if (!choices.empty() && std::find(choices.begin(), choices.end(), *v) == choices.end()) {
    std::string hint = nearest_name(*v, choices);
    fail(key, "= \"" + *v + "\" is not one of " + join(choices, " | ") +
                  (hint.empty() ? "" : " (did you mean \"" + hint + "\"?)"));
  }
  return *v;
}

std::vector<double> RecipeSection::reals(const std::string& key, const std::vector<double>& fallback,
                                         double min, double max) {
  const toml::node* n = lookup(key);
  if (!n) return fallback;
  const toml::array* a = n->as_array();
  if (!a || a->size() != fallback.size())
    fail(key, "must be an array of " + std::to_string(fallback.size()) + " numbers");
  std::vector<double> out;
  for (const auto& e : *a) {
    auto v = e.value<double>();
    if (!v || e.is_boolean()) fail(key, "must hold numbers only");
    if (*v < min || *v > max) {
      std::ostringstream s;
      s << "holds " << *v << ", out of range (valid: " << min << " to " << max << ")";
      fail(key, s.str());
    }
    out.push_back(*v);
  }
  return out;
}

void RecipeSection::finish() const {
  if (!table_) return;
  for (const auto& [k, node] : *table_) {
    std::string key(k.str());
    if (std::find(known_.begin(), known_.end(), key) != known_.end()) continue;
    if (name_.empty() && node.is_table()) continue;   // sections are checked by the caller
    std::string hint = nearest_name(key, known_);
    throw RecipeError(position(key), "unknown key \"" + key + "\"" +
                                      (name_.empty() ? "" : " in [" + name_ + "]") +
                                      (hint.empty() ? "" : " (did you mean \"" + hint + "\"?)"));
  }
}

}  // namespace colossal
