// TextData: the tokenizer and token dataset a text task reads. Rank 0 trains a missing tokenizer and
// tokenizes the corpus (src/data/prepare); every rank then reads the dataset's splits. A run starting
// from a model directory tokenizes with that directory's tokenizer.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "src/data/loader.h"
#include "src/data/tokenizer.h"
#include "src/tasks/task.h"

namespace colossal {

class TextData {
 public:
  explicit TextData(TaskData data) : data_(std::move(data)) {}
  const TaskData& data() const { return data_; }

  void check() const;      // the tokenizer and dataset exist or can be built
  void prepare();          // rank 0: builds what is missing
  void load();             // every rank: the tokenizer and both splits

  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const std::shared_ptr<const std::vector<int32_t>>& train_tokens() const { return train_; }
  const std::vector<int32_t>& val_tokens() const { return val_; }
  std::string describe() const;   // "12.3M train tokens, 40k held out"
  // This rank's loader of windows of `length` + 1 tokens from global sample `samples_seen` on.
  std::unique_ptr<WindowLoader> loader(int64_t length, int64_t samples_seen) const;
  void warn_if_no_eval(bool none) const;

 private:
  std::string tokenizer_override() const { return data_.tokenizer_from_directory ? data_.tokenizer_path : ""; }

  TaskData data_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::shared_ptr<const std::vector<int32_t>> train_;
  std::vector<int32_t> val_;
};

}  // namespace colossal
