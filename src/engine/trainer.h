// Trainer: the engine entry point behind `colossal train` and `colossal finetune`. Builds (or
// prepares) the data, the model and the optimizer from a recipe, optionally resumes, and runs the
// loop: micro-batches with gradient accumulation, clipping, AdamW on flat buffers, the LR schedule,
// periodic eval on the held-out split, checkpoints, metrics, the progress line and a summary.
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
};

// Returns the process exit code (0 done, 130 interrupted after saving). Throws Error on bad input.
int run_training(const Recipe& recipe, const TrainOptions& options);

}  // namespace colossal
