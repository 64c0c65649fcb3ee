// Trainer: the engine entry point behind `colossal train` and `colossal finetune`. Builds the plan
// (train_plan.h: the job's ranks, data, model, data parallelism, optimizer, resumed state) and runs the
// loop: micro-batches with gradient accumulation (gradients reduced across data-parallel ranks on the
// last one only), clipping on the global norm, AdamW on flat buffers, the LR schedule, periodic eval
// on the held-out split, checkpoints, metrics, the progress line and a summary. Rank 0 owns the
// console progress, metrics, summary and checkpoints.
#pragma once
#include <string>

#include "src/core/recipe.h"

namespace colossal {

struct TrainOptions {
  bool finetune = false;       // start from recipe.finetune.from (weights + tokenizer), step 0
  bool resume = false;         // continue from the latest checkpoint (or resume_from)
  std::string resume_from;     // explicit checkpoint path for resume
  bool dry_run = false;        // print the resolved recipe, parameter count and memory estimate
  bool quiet = false;          // console: warnings and the final summary only
  int64_t launch_world = 0;    // --dry-run under --nproc-per-node: the world the launcher would start
  std::string iface;           // network interface for Gloo between nodes ("" = GLOO_SOCKET_IFNAME or the route to the master)
  std::string profile_out;     // `colossal profile`: trace the last step's memory, write profile.json and .html here
};

// Returns the process exit code (0 done, 130 interrupted after saving). Throws Error on bad input.
int run_training(const Recipe& recipe, const TrainOptions& options);

}  // namespace colossal
