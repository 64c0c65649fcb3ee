// BpeModel: byte-pair encoding of one word, as Hugging Face's BPE model does it: the word starts as
// one symbol per character, then the adjacent pair with the lowest merge rank is merged (the
// leftmost on ties) until no pair has a rank. A heap over a linked list of symbols keeps a long word
// at O(n log n); words seen before come from a bounded cache.
#pragma once
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "src/data/vocab.h"

namespace colossal {

struct BpeOptions {
  std::optional<std::string> unk_token;   // for characters outside the vocabulary (else they are dropped)
  bool fuse_unk = false;                  // consecutive unknown characters become one unk
  bool ignore_merges = false;             // a word that is itself in the vocabulary is one token
};

class BpeModel {
 public:
  // `merges` in rank order, each as its two tokens. Throws Error (prefixed with `where`) when a merge
  // names a token, or makes one, that the vocabulary lacks.
  BpeModel(std::unordered_map<std::string, int> vocab, const std::vector<std::pair<std::string, std::string>>& merges,
           BpeOptions options, const std::string& where);

  // Token ids of one word (characters are UTF-8 code points of `word`).
  void encode_word(std::string_view word, std::vector<int>& out) const;
  const Vocab& vocab() const { return vocab_; }

 private:
  std::vector<int> merge(std::string_view word) const;

  Vocab vocab_;
  struct Merge {
    int rank, merged;
  };
  std::unordered_map<uint64_t, Merge> merges_;   // (left id << 32 | right id) -> rank and result
  BpeOptions options_;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int>> cache_;
};

}  // namespace colossal
