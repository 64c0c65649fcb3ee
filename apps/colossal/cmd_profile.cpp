// `colossal profile RECIPE`: trains the recipe for a few steps and traces the last one's memory (per
// block: parameters, gradients, optimizer states, activations; the peak; where each chunk lived), printed
// as a table and written as profile.json and a self-contained profile.html (src/engine/memory_profile.h).
#include <filesystem>
#include <memory>

#include "apps/colossal/commands.h"
#include "src/core/log.h"
#include "src/core/recipe.h"
#include "src/engine/trainer.h"

namespace fs = std::filesystem;

namespace colossal::app {

void add_profile_command(CLI::App& app) {
  struct Args {
    std::string recipe, out;
    std::vector<std::string> overrides;
    int64_t steps = 3;
    bool quiet = false;
  };
  auto args = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("profile", "Trace the memory of a recipe's training step: per block, the peak, and where each chunk "
                                            "lived (a table, profile.json and profile.html)");
  cmd->add_option("recipe", args->recipe, "Recipe file, e.g. recipes/gpt-tiny.toml")->required();
  cmd->add_option("--set", args->overrides, "Override a recipe key: --set memory.zero=3 (repeatable)");
  cmd->add_option("--steps", args->steps, "Steps to run; the last is traced, the ones before warm up (default 3)")->check(CLI::Range(1, 1000));
  cmd->add_option("--out", args->out, "Directory for profile.json, profile.html and the run's logs (default: <output.dir>/profile)");
  cmd->add_flag("-q,--quiet", args->quiet, "Only warnings, the table and the final summary on the console");
  cmd->callback([args] {
    setup_logging("info", "", args->quiet);
    const Recipe base = load_recipe(args->recipe, args->overrides);
    const std::string out = args->out.empty() ? (fs::path(base.output.dir) / "profile").string() : args->out;
    // A fresh run of `steps` steps that saves nothing and evaluates only at its end. The learning-rate
    // schedule keeps the recipe's horizon (base.optim.decay_steps is resolved already), so a warm-up
    // longer than the profiled steps stays valid.
    std::vector<std::string> overrides = args->overrides;
    for (const std::string& o : {"train.max_steps=" + std::to_string(args->steps), "optim.decay_steps=" + std::to_string(base.optim.decay_steps),
                                 std::string("train.eval_every=0"),
                                 std::string("checkpoint.every=0"), std::string("checkpoint.at_end=false"), "output.dir=" + out,
                                 "checkpoint.dir=" + (fs::path(out) / "checkpoints").string()})
      overrides.push_back(o);
    Recipe recipe = load_recipe(args->recipe, overrides);
    setup_logging(recipe.output.log_level, "", args->quiet);
    TrainOptions options;
    options.quiet = args->quiet;
    options.profile_out = out;
    set_exit_code(run_training(recipe, options));
  });
}

}  // namespace colossal::app
