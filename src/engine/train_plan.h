// TrainPlan: everything a training run is made of, built once and in a fixed order before the loop
// runs (torchtitan's trainer shape): the job's ranks and mesh, the data, the model, the parallel
// wrappers, the optimizer and the resumed state. Each later capability plugs in at one named step of
// build_plan (ZeRO and Gemini at "memory", tensor and pipeline parallelism at "parallel layout") rather
// than growing the loop.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <memory>
#include <optional>
#include <utility>
#include <string>
#include <vector>

#include "src/core/recipe.h"
#include "src/dist/runtime.h"
#include "src/engine/checkpoint.h"
#include "src/engine/kernel_cache.h"
#include "src/engine/pipeline_runner.h"
#include "src/engine/trainer.h"
#include "models/registry.h"
#include "src/nn/model.h"
#include "src/memory/memory_tracer.h"
#include "src/memory/recompute_plan.h"
#include "src/memory/train_strategy.h"
#include "src/parallel/sequence_layout.h"
#include "src/tasks/task.h"

namespace colossal {

struct TrainPlan {
  Recipe recipe;                 // as trained: [model] from the checkpoint when finetuning
  TrainOptions options;
  c10::Device device{c10::kCPU};
  std::unique_ptr<dist::Runtime> runtime;
  int64_t dp_rank = 0, dp_size = 1;

  std::string tokenizer_path;     // the recipe's, or the starting directory's tokenizer files
  nlohmann::json base_config;     // config.json of the directory the run started from (null: none)
  std::unique_ptr<Task> task;     // the data, batches, loss and eval metric the model trains on

  std::shared_ptr<nn::Model> model;
  std::unique_ptr<memory::TrainStrategy> strategy;   // memory layout, gradient sync and the optimizer
  TrainerState state;             // step 0, or the checkpoint's when resuming
  std::shared_ptr<memory::AllocationCounter> counter;   // ATen's bytes on this thread (profile, a CPU's device budget)
  std::shared_ptr<memory::MemoryTracer> tracer;   // `colossal profile` only: traces the last step
  std::shared_ptr<nn::BlockHooks> hooks;   // the chain around every block (the model holds it too)
  std::optional<memory::RecomputePlan> recompute_plan;   // activation_checkpoint = "auto": the measured choice
  // The kernel choices an earlier run on this machine timed (engine/kernel_cache.h), loaded when the
  // policy is set; this run's new ones are saved after its first step and at its end (null: cache off).
  std::unique_ptr<KernelCacheSession> kernel_cache;
  // This process's resident memory just before the model was built, and its peak once the weights
  // were in place: what building, initialising or loading the model cost this rank.
  size_t rss_before_model = 0, peak_rss_after_setup = 0;

  // Sequence parallelism: which tokens of each sequence this rank holds (unset: all of them).
  std::optional<parallel::SequenceLayout> sequence;
  // 2D (2.5D) tensor parallelism: this rank's row block and their number, over every grid (each row
  // block holds its part of the batch).
  std::pair<int64_t, int64_t> grid_rows{0, 1};
  // ... and the groups those row blocks are cut along inside the tensor group (empty: none).
  std::vector<dist::Group*> row_groups;
  // Pipeline parallelism: this rank's stages and the schedule that runs a step (null: no pipeline).
  std::unique_ptr<PipelineRunner> pipeline;
  // This rank's share of a batch: its tokens of every sequence with their positions, or the batch itself.
  Batch local_part(const Batch& b) const;
  // The loss of this rank's part of a batch as the batch's: the mean over the row blocks (the gradient
  // scaled to match), or the loss itself.
  at::Tensor batch_loss(const at::Tensor& loss) const;

  bool is_root() const { return runtime->is_root(); }
  int64_t tokens_per_step() const {
    return recipe.train.batch_size * tokens_per_sample(recipe) * recipe.train.grad_accum * dp_size;
  }
};

// The recipe as training will run it, validated against the data; no rank joins, nothing is
// allocated. Also used by --dry-run.
struct EffectiveRecipe {
  Recipe recipe;                 // a starting directory gives [model] its architecture
  std::string tokenizer_path;    // the recipe's, or the starting directory (its tokenizer files)
  std::string init_checkpoint;   // the resolved [model] or [finetune] from ("" when training from scratch)
  nlohmann::json base_config;    // its config.json: fields our config does not write are kept on save
  std::string task;              // what the model trains for (the registry's task of its family)
};
EffectiveRecipe effective_recipe(const Recipe& recipe, const TrainOptions& options);

// The recipe's [parallel] against a world of `world` ranks: mesh sizes, and no dimension whose layers
// are not built yet. The launcher calls it before starting any worker. Throws Error at the recipe key.
dist::MeshShape check_parallel_recipe(const Recipe& recipe, int64_t world);
// [memory] device_memory_limit_gb against the least the device can train the model with
// (minimum_device_bytes): a RecipeError at the key, before anything is allocated.
void check_device_budget(const Recipe& recipe, int64_t parameters, int64_t dp);

// Builds the plan: joins the job, prepares data (rank 0 first), builds and places the model, applies
// data parallelism, the optimizer and the resumed state. Throws Error with a one-line message.
std::unique_ptr<TrainPlan> build_plan(const EffectiveRecipe& effective, const TrainOptions& options);

}  // namespace colossal
