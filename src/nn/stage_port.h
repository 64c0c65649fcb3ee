// StagePort: where a pipeline stage's part of a model meets the schedule that runs it. Every family is
// embed -> blocks -> head, and every family runs its blocks through run_blocks, so that is the one
// place a stage is cut: a pass of the model's own forward (the task's loss, an eval) runs
//  - the embedding only on the first stage; elsewhere the blocks start from `input`, the activation
//    received from the stage before (in the layout the blocks use inside, e.g. Megatron's token split);
//  - only the blocks [begin, end) of this pass (interleaved schedules move the range between passes);
//  - the head and the loss only on the last stage; elsewhere run_blocks leaves the blocks' output in
//    `output` and ends the pass by throwing StageExit, which the schedule catches. Unwinding skips the
//    rest of the forward (final norm, head, loss) without any family or task knowing about stages.
// The port holds no communication: src/parallel/pipeline_* sends and receives around the passes.
#pragma once
#include <ATen/core/Tensor.h>
#include <cstdint>

namespace colossal::nn {

// Not a std::exception: error handlers between run_blocks and the schedule must not mistake it for one.
struct StageExit {};

struct StagePort {
  int64_t begin = 0, end = 0;    // the model's blocks this pass runs
  bool first = true, last = true;
  at::Tensor input;              // !first: the blocks' input for this pass
  at::Tensor output;             // !last: set by run_blocks before it throws StageExit
};

}  // namespace colossal::nn
