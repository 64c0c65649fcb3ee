// `colossal train RECIPE` and `colossal finetune RECIPE`: load the recipe (with --set overrides)
// and run the trainer.
#include <memory>

#include "apps/colossal/commands.h"
#include "src/core/log.h"
#include "src/core/recipe.h"
#include "src/engine/trainer.h"

namespace colossal::app {
namespace {

struct TrainArgs {
  std::string recipe;
  std::vector<std::string> overrides;
  TrainOptions options;
};

void add(CLI::App& app, const std::string& name, bool finetune) {
  auto args = std::make_shared<TrainArgs>();
  args->options.finetune = finetune;
  auto* cmd = app.add_subcommand(
      name, finetune ? "Finetune from the checkpoint a recipe names in [finetune] from (architecture and tokenizer "
                       "come from it; training starts at step 0)"
                     : "Train a model from a TOML recipe (builds the tokenizer and dataset first if they are missing)");
  cmd->add_option("recipe", args->recipe, "Recipe file, e.g. recipes/gpt-mini.toml")->required();
  cmd->add_option("--set", args->overrides, "Override a recipe key: --set optim.lr=1e-4 (repeatable)");
  cmd->add_flag("--resume", args->options.resume, "Continue from the latest checkpoint in [checkpoint] dir");
  cmd->add_option("--resume-from", args->options.resume_from, "Continue from this checkpoint (implies --resume)");
  cmd->add_flag("--dry-run", args->options.dry_run,
                "Print the resolved recipe, parameter count and memory estimate, then exit");
  cmd->add_flag("-q,--quiet", args->options.quiet, "Only warnings and the final summary on the console");
  cmd->callback([args] {
    if (!args->options.resume_from.empty()) args->options.resume = true;
    setup_logging("info", "", args->options.quiet);
    Recipe recipe = load_recipe(args->recipe, args->overrides);
    setup_logging(recipe.output.log_level, "", args->options.quiet);
    set_exit_code(run_training(recipe, args->options));
  });
}

}  // namespace

void add_train_commands(CLI::App& app) {
  add(app, "train", false);
  add(app, "finetune", true);
}

}  // namespace colossal::app
