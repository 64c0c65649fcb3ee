// Vocab: a subword model's token <-> id table, checked once where it is read (no negative ids, no id
// given to two tokens). Ids may leave holes and be sparse: lookups by id go through a hash map, so a
// hostile file naming id 10^8 costs one entry, not 10^8.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

namespace colossal {

class Vocab {
 public:
  Vocab() = default;
  // Error prefixed with `where` for a negative id or two tokens sharing one.
  Vocab(std::unordered_map<std::string, int> ids, const std::string& where);
  std::optional<int> id_of(std::string_view token) const;
  const std::string* token_of(int id) const;   // null for an id no token has
  int64_t end_id() const { return end_; }        // one past the largest id
  size_t size() const { return ids_.size(); }

 private:
  struct Hash {   // lets a string_view look up a std::string key without building one
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, int, Hash, std::equal_to<>> ids_;
  std::unordered_map<int, std::string> tokens_;
  int64_t end_ = 0;
};

}  // namespace colossal
