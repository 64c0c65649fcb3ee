// TrainStrategy: what the training loop asks of the memory and gradient-synchronisation layout
// (ARCHITECTURE.md: the loop talks to a strategy, not to data parallelism by name). ZeroStrategy is
// plain data parallelism (stage 0) and ZeRO stages 1-2; Gemini and pipeline schedules replace parts.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "src/memory/chunk_store.h"
#include "src/optim/optimizer.h"

namespace colossal::memory {

class TrainStrategy {
 public:
  virtual ~TrainStrategy() = default;
  // Around each micro-batch's backward; `last` = the step's last micro-batch (the gradients of the step
  // are complete after it).
  virtual void before_backward(bool last) = 0;
  virtual void after_backward() = 0;
  // The global gradient norm (every rank's shards together), then gradients scaled so it is at most
  // max_norm (when > 0; torch.nn.utils.clip_grad_norm_'s rule).
  virtual double clip_grad_norm(double max_norm) = 0;
  virtual void step(double lr) = 0;     // the optimizer update, then parameters made whole again
  virtual void zero_grad() = 0;
  virtual void broadcast_from_root() = 0;   // every rank starts from rank 0's parameters
  virtual ChunkStore& store() = 0;
  virtual optim::Optimizer& optimizer() = 0;
  virtual std::string describe() const = 0;   // one line for the log

  // Checkpoints. Every tensor this rank writes, with its full value and its full optimizer states (in
  // optimizer().state_names() order); collective: every rank calls it.
  using OwnedFn = std::function<void(int64_t slot, const at::Tensor& param, const std::vector<at::Tensor>& states)>;
  virtual void for_each_owned(const OwnedFn& fn) = 0;
  // This rank's part of slot's optimizer state `k`, copied from the tensor's full value.
  virtual void load_state(int64_t slot, size_t k, const at::Tensor& full) = 0;
};

}  // namespace colossal::memory
