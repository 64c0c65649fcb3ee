// Task: what the trainer trains a model to do, behind one interface: the data a task reads (built by
// rank 0 when missing, then sharded by data-parallel rank), the batches its loader yields, its loss
// and its eval metric. The trainer loops over Task and nn::Model only, so causal LM, masked LM and
// image classification (and the tasks after them) add a file here, not a branch in src/engine.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "src/core/recipe.h"
#include "src/data/hf_tokenizer_files.h"
#include "src/nn/model.h"

namespace colossal {

// A batch as a task's loader yields it; which fields are set is the task's business.
struct Batch {
  at::Tensor inputs;          // token ids [B, T] or images [B, C, H, W]
  at::Tensor targets;         // next tokens [B, T], masked-token labels [B, T] (-100: not scored) or classes [B]
  at::Tensor attention_mask;  // [B, T] int64, 1 on real tokens (encoder tasks; undefined: no padding)
  at::Tensor token_types;     // [B, T] int64 segment ids (undefined: all 0)
  at::Tensor positions;       // [T] int64: where the tokens sit in their sequences, when a rank holds part of
                              // each (sequence parallelism); undefined: 0 .. T-1
  Batch to(const c10::Device& device) const;
};

// What eval batches add up to; summed over every rank before the means are taken.
struct EvalSums {
  double loss = 0;       // sum of per-batch mean losses
  double batches = 0;
  double correct = 0;    // predictions equal to their target (tasks with an accuracy)
  double scored = 0;     // predictions made
  EvalSums& operator+=(const EvalSums& o) {
    loss += o.loss, batches += o.batches, correct += o.correct, scored += o.scored;
    return *this;
  }
};

struct EvalResult {
  double loss = -1;      // -1: no eval batch
  double accuracy = -1;  // -1: the task has no accuracy
};

// Where a task's data comes from: the recipe, the tokenizer (a file or a model directory; "" for tasks
// without text) and this rank's place among the data-parallel ranks.
struct TaskData {
  Recipe recipe;
  std::string tokenizer_path;
  bool tokenizer_from_directory = false;   // a starting directory's tokenizer (never trained here)
  int64_t dp_rank = 0, dp_size = 1;
};

class Task {
 public:
  virtual ~Task() = default;
  virtual std::string name() const = 0;

  // Before anything is built or joined (the dry run too): the recipe names data this task can read or
  // build. RecipeError at the offending key.
  virtual void check_data() const = 0;
  // Rank 0 builds what is missing (tokenizer, dataset) while the other ranks wait; then every rank loads.
  virtual void prepare_data() = 0;
  virtual void load_data() = 0;
  // After load_data: the facts of the start-of-run log line ("12.3M train tokens, 40k held out").
  virtual std::string describe_data() const = 0;
  // The tokenizer files checkpoints keep (empty for tasks without text).
  virtual TokenizerFiles tokenizer_files() const { return {}; }
  // The model can do this task (it is the interface the task drives, with sizes that fit the data).
  virtual void check_model(nn::Model& model) const = 0;

  // Training batches of this rank from global sample `samples_seen` on (resume continues exactly there).
  virtual void start(int64_t samples_seen) = 0;
  virtual Batch next() = 0;
  virtual int64_t position() const = 0;          // global samples consumed

  // Mean loss of one batch (with autograd). A loss that is a mean over a count that varies by batch
  // (masked-LM's masked positions) divides by the count over every part of the step's batch, as
  // set_global_count gives it, so any layout equals one process on the global batch.
  virtual at::Tensor loss(nn::Model& model, const Batch& batch) = 0;
  // How this rank's count becomes the step's (a sum over the ranks holding the other parts of the batch;
  // one process: itself), and the number of parts, whose losses the engine averages: data-parallel
  // replicas times the row blocks a 2D or 3D layout cuts each batch into.
  void set_global_count(std::function<double(double)> sum_over_parts, double parts) {
    global_count_ = std::move(sum_over_parts);
    parts_ = parts;
  }
  // This rank's share of the held-out set, the same batches at every eval.
  virtual const std::vector<Batch>& eval_set() const = 0;
  virtual EvalSums eval(nn::Model& model, const Batch& batch) = 0;
  virtual bool has_accuracy() const { return false; }

 protected:
  std::function<double(double)> global_count_ = [](double local) { return local; };
  double parts_ = 1;
};

// The task `name` reading `data`; Error naming the valid tasks otherwise.
std::unique_ptr<Task> make_task(const std::string& name, TaskData data);
std::vector<std::string> task_names();

}  // namespace colossal
