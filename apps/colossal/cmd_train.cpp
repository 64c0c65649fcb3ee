// `colossal train RECIPE` and `colossal finetune RECIPE`: load the recipe (with --set overrides)
// and run the trainer, or, with --nproc-per-node, launch and supervise that many workers of it.
#include <filesystem>
#include <memory>

#include "apps/colossal/commands.h"
#include "src/core/error.h"
#include "src/core/log.h"
#include "src/core/recipe.h"
#include "src/dist/launcher.h"
#include "src/engine/train_plan.h"
#include "src/engine/trainer.h"

namespace fs = std::filesystem;

namespace colossal::app {
namespace {

struct TrainArgs {
  std::string recipe;
  std::vector<std::string> overrides;
  TrainOptions options;
  dist::LaunchOptions launch;
  int64_t nproc_per_node = 0;   // 0: this process is a worker (alone, or started by a launcher/srun)
};

// A worker's arguments: the same command without the launcher's flags; a restart resumes from the
// latest complete checkpoint when there is one.
std::vector<std::string> worker_args(const std::string& name, const TrainArgs& a, const Recipe& recipe, int64_t attempt) {
  std::vector<std::string> out{name, a.recipe};
  for (const auto& o : a.overrides) out.insert(out.end(), {"--set", o});
  const bool have_checkpoint = fs::is_regular_file(fs::path(recipe.checkpoint.dir) / "latest");
  if (attempt > 0 && have_checkpoint) out.push_back("--resume");
  else if (!a.options.resume_from.empty()) out.insert(out.end(), {"--resume-from", a.options.resume_from});
  else if (a.options.resume) out.push_back("--resume");
  if (a.options.quiet) out.push_back("--quiet");
  if (!a.options.iface.empty()) out.insert(out.end(), {"--iface", a.options.iface});
  return out;
}

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
  const std::string launch = "Distributed launch";
  cmd->add_option("--nproc-per-node", args->nproc_per_node,
                  "Start and supervise this many workers on this node (as torchrun does)")
      ->check(CLI::Range(1, 4096))->group(launch);
  cmd->add_option("--nnodes", args->launch.nnodes, "Nodes in the job (each runs its own launcher)")
      ->check(CLI::Range(1, 1 << 20))->group(launch);
  cmd->add_option("--node-rank", args->launch.node_rank, "This node's index, 0 .. nnodes-1")
      ->check(CLI::Range(0, 1 << 20))->group(launch);
  cmd->add_option("--master-addr", args->launch.master_addr, "Address of node 0, reachable from every node")->group(launch);
  cmd->add_option("--master-port", args->launch.master_port,
                  "Rendezvous port on node 0 (default: a free port with one node, 29500 with several)")
      ->check(CLI::Range(1, 65535))->group(launch);
  cmd->add_option("--max-restarts", args->launch.max_restarts,
                  "Restart the whole job from the latest checkpoint up to N times when a worker fails (default 0)")
      ->check(CLI::Range(0, 1000))->group(launch);
  cmd->add_option("--iface", args->options.iface,
                  "Network interface for collectives between nodes (sets GLOO_SOCKET_IFNAME)")->group(launch);
  cmd->callback([args, name, cmd] {
    if (!args->options.resume_from.empty()) args->options.resume = true;
    setup_logging("info", "", args->options.quiet);
    Recipe recipe = load_recipe(args->recipe, args->overrides);
    setup_logging(recipe.output.log_level, "", args->options.quiet);
    const bool launcher_flags = cmd->count("--nnodes") || cmd->count("--node-rank") || cmd->count("--master-addr") ||
                                cmd->count("--master-port") || cmd->count("--max-restarts");
    if (args->options.dry_run) args->options.launch_world = args->nproc_per_node * args->launch.nnodes;
    if (args->nproc_per_node == 0 || args->options.dry_run) {
      if (launcher_flags && !args->options.dry_run)
        throw Error("--nnodes, --node-rank, --master-addr, --master-port and --max-restarts belong to the launcher: add "
                    "--nproc-per-node N (workers started by torchrun or srun take these from the environment)");
      set_exit_code(run_training(recipe, args->options));
      return;
    }
    dist::LaunchOptions& lo = args->launch;
    if (std::getenv("RANK") && std::getenv("WORLD_SIZE") && std::string(std::getenv("WORLD_SIZE")) != "1")
      throw Error("--nproc-per-node inside a job that already has RANK and WORLD_SIZE (started by torchrun or colossal's "
                  "launcher): drop the flag, the worker joins that job");
    if (lo.node_rank >= lo.nnodes)
      throw Error("--node-rank " + std::to_string(lo.node_rank) + " with --nnodes " + std::to_string(lo.nnodes) +
                  " (node ranks run 0 .. " + std::to_string(lo.nnodes - 1) + ")");
    if (lo.nnodes > 1 && !cmd->count("--master-addr"))
      throw Error("--nnodes " + std::to_string(lo.nnodes) + " needs --master-addr: the address of node 0 that every node reaches");
    if (lo.nnodes > 1 && lo.master_port == 0) lo.master_port = 29500;
    lo.nproc_per_node = args->nproc_per_node;
    check_parallel_recipe(recipe, lo.nnodes * lo.nproc_per_node);   // before any worker starts
    lo.iface = args->options.iface;
    lo.state_dir = (fs::path(recipe.output.dir) / ".launcher" / ("node-" + std::to_string(lo.node_rank))).string();
    // A copy of the arguments, not the shared pointer: `args` owns this function, and holding `args` in it
    // would be a reference cycle that never frees (LeakSanitizer found it).
    lo.worker_args = [a = *args, name, recipe](int64_t attempt) { return worker_args(name, a, recipe, attempt); };
    set_exit_code(dist::run_launcher(lo));
  });
}

}  // namespace

void add_train_commands(CLI::App& app) {
  add(app, "train", false);
  add(app, "finetune", true);
}

}  // namespace colossal::app
