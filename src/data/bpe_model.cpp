// BPE merging: see bpe_model.h.
#include "src/data/bpe_model.h"

#include <queue>

#include "src/core/error.h"
#include "src/data/unicode.h"

namespace colossal {
namespace {

uint64_t pair_key(int a, int b) { return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b); }

constexpr size_t kCacheLimit = 1 << 16;   // words; cleared when full (a corpus's common words return quickly)

}  // namespace

BpeModel::BpeModel(std::unordered_map<std::string, int> vocab, const std::vector<std::pair<std::string, std::string>>& merges,
                   BpeOptions options, const std::string& where)
    : vocab_(std::move(vocab), where), options_(std::move(options)) {
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const std::string& a = merges[rank].first;   // not a structured binding: clang 14 cannot capture those
    const std::string& b = merges[rank].second;
    auto need = [&](const std::string& token) {
      if (auto id = vocab_.id_of(token)) return *id;
      throw Error(where + ": merge " + std::to_string(rank + 1) + " (\"" + a + " " + b + "\") needs the token \"" + token +
                  "\", which is not in the vocabulary");
    };
    const int left = need(a), right = need(b), merged = need(a + b);
    merges_.emplace(pair_key(left, right), Merge{static_cast<int>(rank), merged});   // a repeated pair keeps its first rank
  }
  if (options_.unk_token && !vocab_.id_of(*options_.unk_token))
    throw Error(where + ": the unknown token \"" + *options_.unk_token + "\" is not in the vocabulary");
}

std::vector<int> BpeModel::merge(std::string_view word) const {
  struct Symbol {
    int id;
    int prev, next;   // -1 at the ends
    bool alive;
  };
  std::vector<Symbol> syms;
  const int unk = options_.unk_token ? *vocab_.id_of(*options_.unk_token) : -1;
  for (size_t i = 0; i < word.size();) {
    const auto d = unicode::decode_at(word, i);
    const auto known = vocab_.id_of(word.substr(i, static_cast<size_t>(d.len)));
    i += static_cast<size_t>(d.len);
    int id;
    if (known) id = *known;
    else if (unk < 0) continue;   // no unknown token: the character is dropped, as HF does
    else if (options_.fuse_unk && !syms.empty() && syms.back().id == unk) continue;
    else id = unk;
    const int n = static_cast<int>(syms.size());
    syms.push_back({id, n - 1, -1, true});
    if (n > 0) syms[static_cast<size_t>(n - 1)].next = n;
  }

  struct Candidate {
    int rank, pos, merged;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto offer = [&](int pos) {
    if (pos < 0) return;
    const Symbol& s = syms[static_cast<size_t>(pos)];
    if (s.next < 0) return;
    auto it = merges_.find(pair_key(s.id, syms[static_cast<size_t>(s.next)].id));
    if (it != merges_.end()) heap.push({it->second.rank, pos, it->second.merged});
  };
  for (int i = 0; i + 1 < static_cast<int>(syms.size()); ++i) offer(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol& left = syms[static_cast<size_t>(c.pos)];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = syms[static_cast<size_t>(left.next)];
    auto it = merges_.find(pair_key(left.id, right.id));
    if (it == merges_.end() || it->second.merged != c.merged) continue;   // stale: a neighbour merged first
    left.id = c.merged;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) syms[static_cast<size_t>(right.next)].prev = c.pos;
    offer(left.prev);
    offer(c.pos);
  }
  std::vector<int> ids;
  for (const auto& s : syms)
    if (s.alive) ids.push_back(s.id);
  return ids;
}

void BpeModel::encode_word(std::string_view word, std::vector<int>& out) const {
  if (options_.ignore_merges)
    if (auto id = vocab_.id_of(word)) {
      out.push_back(*id);
      return;
    }
  std::string key(word);
  {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (auto it = cache_.find(key); it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int> ids = merge(word);
  out.insert(out.end(), ids.begin(), ids.end());
  std::lock_guard<std::mutex> lock(cache_mutex_);
  if (cache_.size() >= kCacheLimit) cache_.clear();
  cache_.emplace(std::move(key), std::move(ids));
}

}  // namespace colossal
