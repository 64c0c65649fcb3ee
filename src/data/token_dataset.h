// Tokenized dataset in HDF5: groups /train and /val, each with `tokens` (int32, all documents
// concatenated, each ended by EOS; chunked and deflate-compressed) and `doc_offsets` (int64, n_docs+1
// boundaries). Root attributes: vocab_size and the tokenizer's fingerprint, so a dataset built with
// another tokenizer is caught before training on it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace colossal {

struct TokenSplit {
  std::vector<int32_t> tokens;
  std::vector<int64_t> doc_offsets{0};
  int64_t documents() const { return static_cast<int64_t>(doc_offsets.size()) - 1; }
  void append_document(const std::vector<int>& ids, int eos);
};

struct TokenDatasetInfo {
  int64_t vocab_size = 0;
  std::string tokenizer_fingerprint;
  int64_t train_tokens = 0, val_tokens = 0;
};

// Written to a temporary file and renamed, so an interrupted prepare leaves no half dataset.
void write_token_dataset(const std::string& path, const TokenSplit& train, const TokenSplit& val,
                         int64_t vocab_size, const std::string& tokenizer_fingerprint);
TokenDatasetInfo read_token_dataset_info(const std::string& path);
TokenSplit read_token_split(const std::string& path, const std::string& split);   // "train" | "val"

}  // namespace colossal
