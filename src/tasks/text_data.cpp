// Text task data: see text_data.h.
#include "src/tasks/text_data.h"

#include <spdlog/spdlog.h>

#include "src/core/error.h"
#include "src/core/text.h"
#include "src/data/prepare.h"
#include "src/data/token_dataset.h"

namespace colossal {

void TextData::check() const {
  if (data_.tokenizer_from_directory && Tokenizer::read_files(data_.tokenizer_path).empty())
    throw Error("model directory " + data_.tokenizer_path +
                ": no tokenizer files (expected tokenizer.model, tokenizer.json, vocab.json + merges.txt or vocab.txt)");
  check_data_sources(data_.recipe, tokenizer_override());
}

void TextData::prepare() { ensure_data(data_.recipe, tokenizer_override()); }

void TextData::load() {
  tokenizer_ = std::make_unique<Tokenizer>(Tokenizer::load(data_.tokenizer_path));
  train_ = std::make_shared<const std::vector<int32_t>>(read_token_split(data_.recipe.data.dataset, "train").tokens);
  val_ = read_token_split(data_.recipe.data.dataset, "val").tokens;
}

std::string TextData::describe() const {
  return human_count(static_cast<double>(train_->size())) + " train tokens, " + human_count(static_cast<double>(val_.size())) +
         " held out";
}

std::unique_ptr<WindowLoader> TextData::loader(int64_t length, int64_t samples_seen) const {
  const Recipe& r = data_.recipe;
  LoaderConfig lc{r.train.batch_size, length, static_cast<uint64_t>(r.train.seed), data_.dp_rank, data_.dp_size, r.data.prefetch};
  return std::make_unique<WindowLoader>(train_, lc, samples_seen);
}

void TextData::warn_if_no_eval(bool none) const {
  if (none && data_.dp_rank == 0)
    spdlog::warn("held-out split ({} tokens) is too small for one eval batch per rank; eval is skipped", val_.size());
}

}  // namespace colossal
