// TrainStrategy: what the training loop asks of the memory and gradient-synchronisation layout
// (ARCHITECTURE.md: the loop talks to a strategy, not to data parallelism by name). ZeroStrategy is
// plain data parallelism (stage 0) and ZeRO stages 1-2; Gemini and pipeline schedules replace parts.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "src/memory/chunk_store.h"
#include "src/nn/block_hooks.h"
#include "src/optim/optimizer.h"

namespace colossal::memory {

class TrainStrategy {
 public:
  virtual ~TrainStrategy() = default;
  // Before each forward (training micro-batches and eval): parameters outside the blocks are up to date.
  virtual void before_forward() {}
  // Around each micro-batch's backward; `last` = the step's last micro-batch (the gradients of the step
  // are complete after it).
  virtual void before_backward(bool last) = 0;
  virtual void after_backward() = 0;
  // The loss to call backward on: scaled by fp16's loss scale, else the loss itself.
  virtual at::Tensor scale_loss(const at::Tensor& loss) = 0;
  // After the step's last backward: gradients unscaled and checked, clipped on the global norm (every
  // rank's shards together) to max_norm when > 0 (torch.nn.utils.clip_grad_norm_'s rule), the optimizer
  // update, parameters made whole again, gradients zeroed. An fp16 step whose gradients overflowed
  // is skipped instead (and the loss scale backs off).
  struct StepReport {
    double grad_norm = 0;    // before clipping
    bool skipped = false;
    double loss_scale = 1;   // what this step's loss was scaled by (fp16; 1 otherwise)
    double update_s = 0;     // the norm, clipping and the update (NVMe transfers included)
    double norm_s = 0;       // of which the global norm
    // The update ran beside the next forward (overlap_update): update_s is then the norm's and the last
    // step's update's own time, and update_wait_s what this step waited for that update.
    bool overlapped = false;
    double update_wait_s = 0;
    int64_t nvme_read = 0, nvme_written = 0;   // this rank's bytes through its offload file since the last report
    int64_t device_peak = 0, evictions = 0;    // under a device budget: the most the device held, chunks evicted (since the last report)
  };
  virtual StepReport optimizer_step(double lr, double max_norm) = 0;
  // The loss-scale state, for metrics and checkpoints (empty without a scaler).
  virtual std::map<std::string, std::string> scaler_state() const = 0;
  virtual void load_scaler_state(const std::map<std::string, std::string>& state, const std::string& where) = 0;
  virtual double loss_scale() const = 0;       // 1 without a scaler
  virtual int64_t skipped_steps() const = 0;   // overflowed steps so far
  virtual ChunkStore& store() = 0;
  // The whole gradient of parameter `name` as autograd accumulated it, before the data-parallel
  // reduction (pipeline parallelism sums a tied embedding's between its two stages there).
  virtual at::Tensor full_grad(const std::string& name) = 0;
  // The hook this strategy needs in the model's block-hook chain (null: none), which the engine adds.
  virtual std::shared_ptr<nn::BlockHook> block_hook() const { return nullptr; }
  virtual optim::Optimizer& optimizer() = 0;
  virtual std::string describe() const = 0;   // one line for the log

  // Checkpoints. Every tensor this rank writes, with its full value and its full optimizer states (in
  // optimizer().state_names() order); collective: every rank calls it. The tensors may be views of
  // buffers reused after the call returns: write them, do not keep them.
  using OwnedFn = std::function<void(int64_t slot, const at::Tensor& param, const std::vector<at::Tensor>& states)>;
  virtual void for_each_owned(const OwnedFn& fn) = 0;
  // This rank's part of slot's optimizer state `k`, copied from the tensor's full value.
  virtual void load_state(int64_t slot, size_t k, const at::Tensor& full) = 0;
};

}  // namespace colossal::memory
