// ChunkStore: the one owner of parameter, gradient and optimizer memory (ARCHITECTURE.md). The model's
// parameters become views into chunk buffers laid out by ChunkLayout; gradients and optimizer states
// live beside them, full or as this rank's shard depending on the ZeRO stage:
//
//   stage  parameters  gradients                               optimizer states, master weights
//   0      full        full (.grad views, all-reduced)          full
//   1      full        full (.grad views, reduce-scattered)     shard
//   2      full        shard (each micro-batch's gradient       shard
//                      reduce-scattered, then dropped)
//
// Mixed precision: the model's parameters (and .grad) are compute-dtype chunks (bf16, fp16), while the
// optimizer updates master weights in the model's own dtype (fp32), sharded like the optimizer states,
// with gradients taken to that dtype first; the updated master is then cast back into the compute
// chunks. In one precision the master is the parameters themselves.
//
// Plain data parallelism is stage 0: the same store with nothing sharded. Gradient reduction and the
// update itself are ZeroStrategy's; the store answers where things are.
#pragma once
#include <ATen/core/Tensor.h>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "src/memory/chunk_layout.h"
#include "src/memory/tensor_state.h"
#include "src/nn/module.h"
#include "src/optim/optimizer.h"

namespace colossal::memory {

struct ChunkBytes {       // what this rank holds, in bytes
  int64_t params = 0, grads = 0, optimizer = 0;
  int64_t total() const { return params + grads + optimizer; }
};

class ChunkStore {
 public:
  // Moves `module`'s trainable parameters (their current values) into chunks of `chunk_numel` elements
  // cut into `shards` shards, of which this rank is `rank`. Stage 0 keeps one shard = the whole chunk.
  // `compute`: the dtype the model then computes in (undefined: its own, the master's).
  ChunkStore(nn::Module& module, int stage, int64_t chunk_numel, int64_t shards, int64_t rank,
             std::optional<at::ScalarType> compute = std::nullopt);

  int stage() const { return stage_; }
  int64_t rank() const { return rank_; }
  const ChunkLayout& layout() const { return layout_; }
  const std::vector<at::Tensor>& params() const { return params_; }   // full chunk buffers, compute dtype
  bool mixed() const { return mixed_; }                                // compute dtype != master dtype
  // This rank's master shard of each chunk (the model's dtype; a view of params() when not mixed).
  const std::vector<at::Tensor>& master() const { return master_; }
  const at::Tensor& param_of(int64_t slot) const { return tensors_[static_cast<size_t>(slot)]; }   // the model's parameter

  // This rank's range of chunk c: [begin, begin + numel). Stage 0: the whole chunk.
  int64_t shard_begin(int64_t chunk) const;
  int64_t shard_numel(int64_t chunk) const;
  // The rank that writes slot's tensor in a checkpoint: the one whose shard holds its first element
  // (stage 0: rank 0, which holds everything).
  int64_t owner(int64_t slot) const;

  // Full gradient chunk buffers in the compute dtype (stages 0 and 1: the .grad views point into them;
  // stage 2: none).
  std::vector<at::Tensor>& full_grads() { return full_grads_; }
  // This rank's gradient shard of each chunk: stage 0 the whole chunk, stage 1 a view of the full
  // buffer (both compute dtype), stage 2 a master-dtype buffer of its own.
  std::vector<at::Tensor>& grad_shards() { return grad_shards_; }
  // The gradient shards in the master dtype, what the optimizer reads: grad_shards() themselves when
  // they are that dtype already, else buffers that collect_grads fills.
  std::vector<at::Tensor>& master_grads() { return master_grads_; }
  // master_grads = grad_shards * inv_scale (a loss scale undone, or 1).
  void collect_grads(double inv_scale);
  // The compute chunks' shards take the updated master values (nothing to do when not mixed).
  void publish();
  // This rank's shard of optimizer state `name` for each chunk (zeros when first asked for).
  std::vector<at::Tensor>& state(const std::string& name);

  // The pieces of every tensor inside this rank's shards, with `state_names` states, for the optimizer.
  std::vector<optim::ParamPiece> pieces(const std::vector<std::string>& state_names, double weight_decay);

  TensorState& tensor_state(int64_t slot) { return states_[static_cast<size_t>(slot)]; }
  ChunkBytes bytes() const;   // what this rank holds now (stage 2's in-flight gradient chunks excluded)

 private:
  int stage_;
  int64_t rank_;
  ChunkLayout layout_;
  std::vector<at::Tensor> tensors_;   // the model's parameters, by slot
  std::vector<TensorState> states_;   // by slot
  bool mixed_ = false;
  std::vector<at::Tensor> params_, master_, full_grads_, grad_shards_, master_grads_;
  std::map<std::string, std::vector<at::Tensor>> optimizer_states_;   // a map: references stay valid
};

// The trainable parameters of `module` as chunk specs, in registration (execution) order; decay for
// tensors of two or more dimensions, as GPT-2, nanoGPT and the HF recipes do.
std::vector<ChunkTensorSpec> chunk_specs(nn::Module& module);

}  // namespace colossal::memory
