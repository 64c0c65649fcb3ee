// `colossal data ...`: build tokenizers and tokenized datasets, standalone or as a recipe names them.
#include <memory>
#include <spdlog/spdlog.h>

#include "apps/colossal/cli_checks.h"
#include "apps/colossal/commands.h"
#include "src/core/error.h"
#include "src/core/log.h"
#include "src/core/recipe.h"
#include "src/core/text.h"
#include "src/data/prepare.h"
#include "src/data/token_dataset.h"
#include "src/data/tokenizer.h"
#include "src/io/atomic_dir.h"

namespace colossal::app {
namespace {

int g_exit_code = 0;

}  // namespace

void set_exit_code(int code) { g_exit_code = code; }
int exit_code() { return g_exit_code; }

void add_data_commands(CLI::App& app) {
  auto* data = app.add_subcommand("data", "Prepare training data: tokenizers and tokenized datasets");
  data->require_subcommand(1);

  struct TokArgs { std::string text, out; int64_t vocab = 8192; };
  auto tok = std::make_shared<TokArgs>();
  auto* t = data->add_subcommand("tokenizer", "Train a SentencePiece BPE tokenizer on a text file");
  t->add_option("--text", tok->text, "Text to learn from (one sentence or line per line)")->required();
  t->add_option("--vocab", tok->vocab, "Vocabulary size")->capture_default_str()->check(CLI::Range(300, 1 << 20));
  t->add_option("--out", tok->out, "Where to write the .model file")->required();
  t->callback([tok] {
    setup_logging("info");
    prepare_output_file(tok->out, "--out");
    Tokenizer::train(tok->text, tok->vocab, tok->out);
    spdlog::info("wrote {} ({} pieces)", tok->out, Tokenizer::load(tok->out).vocab_size());
  });

  struct PrepArgs { std::string text, tokenizer, out; double val_fraction = 0.02; };
  auto prep = std::make_shared<PrepArgs>();
  auto* p = data->add_subcommand("prepare", "Tokenize a text file into an HDF5 dataset with a held-out split");
  p->add_option("--text", prep->text, "Text file; documents are separated by blank lines")->required();
  p->add_option("--tokenizer", prep->tokenizer, "SentencePiece .model file")->required();
  p->add_option("--out", prep->out, "Where to write the .h5 dataset")->required();
  p->add_option("--val-fraction", prep->val_fraction, "Share of documents held out for eval")->capture_default_str()->check(finite_in(0.0, 0.5));
  p->callback([prep] {
    setup_logging("info");
    prepare_output_file(prep->out, "--out");
    auto st = prepare_dataset(prep->text, Tokenizer::load(prep->tokenizer), prep->out, prep->val_fraction);
    spdlog::info("wrote {}: {} documents, {} train tokens, {} held-out tokens ({} documents)", prep->out, st.documents,
                 human_count(static_cast<double>(st.train_tokens)), human_count(static_cast<double>(st.val_tokens)), st.val_documents);
  });

  struct RecipeArgs { std::string recipe; std::vector<std::string> overrides; };
  auto ra = std::make_shared<RecipeArgs>();
  auto* r = data->add_subcommand("prepare-recipe", "Build the tokenizer and dataset a recipe names, if missing");
  r->add_option("recipe", ra->recipe, "Recipe file")->required();
  r->add_option("--set", ra->overrides, "Override a recipe key (repeatable)");
  r->callback([ra] {
    setup_logging("info");
    Recipe recipe = load_recipe(ra->recipe, ra->overrides);
    ensure_data(recipe);
    auto info = read_token_dataset_info(recipe.data.dataset);
    spdlog::info("{}: {} train tokens, {} held-out tokens, vocabulary {}", recipe.data.dataset,
                 human_count(static_cast<double>(info.train_tokens)), human_count(static_cast<double>(info.val_tokens)), info.vocab_size);
  });
}

}  // namespace colossal::app
