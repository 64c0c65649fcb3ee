// Error types that reach the user as one line: what went wrong, where, and what would be valid.
// apps/colossal catches Error at the top and prints "error: <message>" with a non-zero exit.
#pragma once
#include <stdexcept>
#include <string>

namespace colossal {

// Any user-facing failure: bad input, bad file, bad environment. The message is the whole line.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// A recipe problem, located as "<file>:<line>: [section] key ..." (or "--set key" for overrides).
class RecipeError : public Error {
 public:
  RecipeError(const std::string& where, const std::string& message)
      : Error(where + ": " + message), where_(where) {}
  const std::string& where() const { return where_; }

 private:
  std::string where_;
};

// A [model] value a family cannot build, raised where only the values are known; whoever holds the
// recipe turns it into a RecipeError at the key's location (models/registry.cpp).
class ModelKeyError : public Error {
 public:
  ModelKeyError(const std::string& key, const std::string& message)
      : Error("[model] " + key + " " + message), key_(key), message_(message) {}
  const std::string& key() const { return key_; }
  const std::string& message() const { return message_; }

 private:
  std::string key_, message_;
};

}  // namespace colossal
