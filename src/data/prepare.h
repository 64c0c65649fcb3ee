// Data preparation: text -> documents -> tokenizer -> HDF5 dataset, and the check that a recipe's
// tokenizer, dataset and model agree. `colossal data` and `colossal train` (for recipes whose data
// is not built yet) both come through here.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace colossal {

struct Recipe;
class Tokenizer;

// Documents are separated by one or more blank lines. Error if the file is missing or holds none.
std::vector<std::string> read_documents(const std::string& text_path);
// The same errors without reading the whole file: stops at the first non-blank line.
void require_corpus(const std::string& text_path);

struct PrepareStats {
  int64_t documents = 0, train_tokens = 0, val_tokens = 0, val_documents = 0;
};
// Encodes every document (EOS after each) and holds out about `val_fraction` of them, chosen by a
// hash of their index so the split is fixed for a given text.
PrepareStats prepare_dataset(const std::string& text_path, const Tokenizer& tokenizer, const std::string& out_path,
                             double val_fraction);

// Builds what the recipe names but is missing (tokenizer from data.text, then dataset), then checks
// that tokenizer, dataset and model agree. `tokenizer_override` (finetuning) replaces data.tokenizer.
// What ensure_data checks before building anything (paths set; a missing tokenizer or dataset has a
// text to build it from): the dry run runs it too, so a recipe that cannot train fails there.
void check_data_sources(const Recipe& recipe, const std::string& tokenizer_override = "");
void ensure_data(const Recipe& recipe, const std::string& tokenizer_override = "");

}  // namespace colossal
