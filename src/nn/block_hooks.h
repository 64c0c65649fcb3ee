// BlockHooks: the explicit chain of hooks the engine puts around every transformer block's execution
// (ARCHITECTURE.md: gather/fetch -> recompute -> profile). A hook sees a block's index before and after
// its forward, and before and after its backward. The backward calls come from two small autograd
// functions: an identity at the block's output, whose backward runs as the block's output gradient
// arrives (before the block's own backward), and one at its input, whose backward runs once the block's
// backward has produced the input's gradient. `before_*` run in chain order, `after_*` in reverse, as
// nested scopes do. Models run their blocks through run_blocks, which applies the chain the model holds;
// nothing is patched and nothing is global.
#pragma once
#include <ATen/core/Tensor.h>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "src/nn/stage_port.h"

namespace colossal::nn {

class BlockHook {
 public:
  virtual ~BlockHook() = default;
  virtual void before_forward(int64_t /*block*/) {}
  virtual void after_forward(int64_t /*block*/) {}
  virtual void before_backward(int64_t /*block*/) {}
  virtual void after_backward(int64_t /*block*/) {}
};

class BlockHooks {
 public:
  void add(std::shared_ptr<BlockHook> hook) { hooks_.push_back(std::move(hook)); }
  // Blocks whose activations are recomputed in backward (recompute.h): block i when recompute[i].
  void set_recompute(std::vector<bool> recompute) { recompute_ = std::move(recompute); }
  bool recomputes(int64_t block) const { return block < static_cast<int64_t>(recompute_.size()) && recompute_[static_cast<size_t>(block)]; }
  // A pipeline stage: run_blocks runs only the port's blocks, from its input, and stops after them
  // unless the stage is the last (stage_port.h). Null: the whole model.
  void set_stage(std::shared_ptr<StagePort> stage) { stage_ = std::move(stage); }
  StagePort* stage() const { return stage_.get(); }
  bool empty() const { return hooks_.empty() && recompute_.empty() && !stage_; }
  // forward(x) as block `block`, with the chain around it (recomputed in backward when chosen: then
  // `forward` is kept until backward, so it must capture by value). With grad enabled, a block input
  // that does not require grad (the first block's, when the embeddings are frozen) becomes a leaf that
  // does, so after_backward still runs for that block.
  at::Tensor run(int64_t block, const at::Tensor& x, const std::function<at::Tensor(const at::Tensor&)>& forward) const;

  // Called by the autograd functions (and tests).
  void before_backward(int64_t block) const;
  void after_backward(int64_t block) const;

 private:
  std::vector<std::shared_ptr<BlockHook>> hooks_;
  std::vector<bool> recompute_;
  std::shared_ptr<StagePort> stage_;
};

}  // namespace colossal::nn
