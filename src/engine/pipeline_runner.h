// PipelineRunner: pipeline parallelism applied to a model from outside. The recipe's partition cuts the
// model's blocks into P x v virtual stages (src/parallel/pipeline_partition.h); this rank holds the
// blocks of its v stages, the embedding when it runs stage 0 and the head when it runs the last (a tied
// embedding on both, its gradients summed between them before the update). Parameters this rank does
// not hold stay deferred and out of the chunk store (they are marked as not requiring grad), so a
// stage's memory is its part of the model.
//
// A training step runs the schedule's passes (src/parallel/pipeline_schedule.h) over the step's
// micro-batches: a forward pass runs the task's own loss through the model with the stage port set
// (src/nn/stage_port.h), from the activation received from the stage before; a backward pass runs
// autograd from the loss (last stage) or from the gradient received from the stage after, and sends
// its input's gradient back. Gradients accumulate over the micro-batches; the data-parallel reduction
// runs once after the last pass. The loss exists on the last stage only: the trainer averages it over
// the ranks that have one.
#pragma once
#include <ATen/core/Tensor.h>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "src/core/recipe.h"
#include "src/dist/runtime.h"
#include "src/nn/model.h"
#include "src/nn/stage_port.h"
#include "src/parallel/pipeline_schedule.h"
#include "src/parallel/stage_link.h"
#include "src/tasks/task.h"

namespace colossal {

struct TrainPlan;

// The recipe's [parallel] pipeline keys against the model (before anything is allocated): a schedule
// that is built, enough blocks for every stage, micro-batches the schedule can use, a family that says
// where its embedding is. Error at the key otherwise.
void check_pipeline_recipe(const Recipe& recipe);
// The micro-batches a step runs under pipeline parallelism (micro_batches, or its "auto").
int64_t pipeline_micro_batches(const ParallelConfig& parallel);

class PipelineRunner {
 public:
  // After the model is built (shapes only) and before the chunk store takes its parameters: marks the
  // parameters this rank does not hold.
  // `task` and `device`: partition = "profile" times a micro-batch through a one-block model first.
  PipelineRunner(const Recipe& recipe, nn::Model& model, dist::Runtime& runtime, Task& task, const c10::Device& device);

  std::shared_ptr<nn::StagePort> port() const { return port_; }   // for the model's block-hook chain
  bool holds(const std::string& parameter) const { return held_.count(parameter) > 0; }
  const std::vector<std::string>& tied() const { return tied_; }   // held here and on the other end
  bool first() const { return link_.stage_of(0) == 0; }
  bool last() const { return link_.stage_of(chunks_ - 1) == link_.stages() - 1; }
  std::string describe() const;   // "stage 0 of 2: blocks 0-3 with the embedding (1f1b, 8 micro-batches)"

  // One step's passes over `micro` (this rank's part of each micro-batch). Returns the sum of the
  // micro-batches' losses, each divided by their number (the last stage; zero elsewhere). Gradients
  // are complete and reduced over the data-parallel ranks on return.
  at::Tensor train_step(TrainPlan& plan, const std::vector<Batch>& micro);
  // The task's eval sums over `batches` (this rank's part of each): the last stage's; zero elsewhere.
  EvalSums eval(TrainPlan& plan, const std::vector<Batch>& batches);

  // The last step's bubble: its idle fraction in pass units (forward 1, backward 2; see stage_link.h)
  // over the slowest rank's clock, the seconds its receives blocked, and the most micro-batches whose
  // activations this rank held at once.
  struct StepStats {
    double idle = 0;
    double wait_s = 0;
    int64_t peak_held = 0;
  };
  const StepStats& last_step() const { return stats_; }

 private:
  struct Held;   // one micro-batch's pass through one chunk: its input, its output or loss
  void forward(TrainPlan& plan, const Batch& batch, int64_t micro, int64_t chunk, Held& held, int64_t micros);
  void backward(TrainPlan& plan, int64_t micro, int64_t chunk, Held& held);
  void set_port(int64_t chunk);
  void sum_tied_gradients(TrainPlan& plan);

  dist::Group& pipeline_;
  int64_t chunks_ = 1;
  parallel::PipelineSchedule schedule_;
  bool split_ = false;   // zero_bubble: backward in two passes, a micro-batch held until its W
  std::vector<parallel::PipelinePass> passes_;   // this rank's order of passes for passes_micros_ micro-batches
  int64_t passes_micros_ = 0;
  std::vector<int64_t> bounds_;   // virtual stage s runs blocks [bounds_[s], bounds_[s + 1])
  std::set<std::string> held_;
  std::vector<std::string> tied_;
  std::shared_ptr<nn::StagePort> port_ = std::make_shared<nn::StagePort>();
  parallel::StageLink link_;
  double clock_ = 0;   // logical time of this rank's passes this step
  StepStats stats_;
};

}  // namespace colossal
