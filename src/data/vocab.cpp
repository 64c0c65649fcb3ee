// Token <-> id table: see vocab.h.
#include "src/data/vocab.h"

#include <algorithm>

#include "src/core/error.h"

namespace colossal {

Vocab::Vocab(std::unordered_map<std::string, int> ids, const std::string& where) : ids_(ids.begin(), ids.end()) {
  tokens_.reserve(ids_.size());
  for (const auto& [token, id] : ids_) {
    if (id < 0) throw Error(where + ": token \"" + token + "\" has the negative id " + std::to_string(id));
    auto [it, fresh] = tokens_.emplace(id, token);
    if (!fresh) {
      const auto& [first, second] = std::minmax(it->second, token);   // sorted: the message does not depend on hash order
      throw Error(where + ": tokens \"" + first + "\" and \"" + second + "\" share the id " + std::to_string(id));
    }
    end_ = std::max<int64_t>(end_, int64_t{id} + 1);
  }
}

std::optional<int> Vocab::id_of(std::string_view token) const {
  auto it = ids_.find(token);
  if (it == ids_.end()) return std::nullopt;
  return it->second;
}

const std::string* Vocab::token_of(int id) const {
  auto it = tokens_.find(id);
  return it == tokens_.end() ? nullptr : &it->second;
}

}  // namespace colossal
