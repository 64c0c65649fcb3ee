// Optimizer: an update rule over pieces of parameters, each a flat range of one tensor with its gradient
// and state in equal-length 1-D views. Whoever owns the memory (the chunk store: a whole model, a ZeRO
// shard or a Gemini chunk) hands over the pieces this rank updates, so every rule runs unchanged at every
// ZeRO stage; a tensor split across two ranks' shards arrives as one piece on each.
#pragma once
#include <ATen/core/Tensor.h>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace colossal::optim {

struct ParamPiece {
  at::Tensor param, grad;          // 1-D views of the same length
  std::vector<at::Tensor> state;   // one view per Optimizer::state_names(), same length
  double weight_decay = 0.0;       // the piece's tensor takes weight decay (matrices, embeddings) or not
  int64_t tensor = 0;              // which tensor it belongs to (layer-wise rules reduce norms per tensor)
  // A 16-bit gradient (bf16 or fp16, handed only to an optimizer that reads_half_grads) is read as
  // float(grad) * grad_factor, before StepContext::grad_scale: what a compact gradient shard still owes.
  double grad_factor = 1.0;
};

// What one step needs besides the pieces.
struct StepContext {
  double lr = 0;
  int64_t tensors = 0;   // every piece's `tensor` is below this (the same count on every rank)
  // Sums a double CPU tensor over the ranks whose shards hold parts of the same tensors (a no-op when
  // this rank holds whole tensors): how a layer-wise rule gets the norm of a tensor split across shards.
  std::function<void(at::Tensor&)> sum_across_shards = [](at::Tensor&) {};
  // Gradients are to be read times this (clipping), by an optimizer that folds_grad_scale(); others
  // get gradients already scaled and 1 here.
  double grad_scale = 1;
};

// Per tensor, over all shards, the squared L2 norm of each quantity `of[k](i)` (piece i's part of it):
// a [of.size(), ctx.tensors] double CPU tensor, from one transfer and one sum across shards.
using PieceValue = std::function<at::Tensor(size_t piece)>;
at::Tensor squared_norms(const std::vector<ParamPiece>& pieces, const StepContext& ctx, const std::vector<PieceValue>& of);

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual std::string name() const = 0;                      // "adamw"
  virtual std::vector<std::string> state_names() const = 0;  // "exp_avg", ...: checkpoint suffixes too
  // One update of every piece (counts the step first: bias corrections see 1, 2, ...).
  void step(std::vector<ParamPiece>& pieces, const StepContext& ctx) {
    begin_step();
    update(pieces, ctx);
  }
  // The same step in parts, for memory that reaches the optimizer a chunk at a time (NVMe offload):
  // the step is counted once, then every piece is updated exactly once across the update calls. A
  // layer-wise rule needs all of a tensor's pieces in one call (a tensor lies within one chunk), and
  // every rank must make the same calls (sum_across_shards is a collective).
  void begin_step() { ++step_; }
  virtual void update(std::vector<ParamPiece>& pieces, const StepContext& ctx) = 0;
  // Applies ctx.grad_scale itself, in the pass it makes anyway (AdamW's fused kernel).
  virtual bool folds_grad_scale() const { return false; }
  // Takes pieces whose gradients are bf16 or fp16 with a ParamPiece::grad_factor (fp32 parameters),
  // widening them as it reads them (AdamW's fused kernel): no fp32 copy of a compact shard's gradients.
  virtual bool reads_half_grads() const { return false; }
  // Each element's update depends on that element alone (no per-tensor norms), so a tensor may reach
  // update() in pieces across several calls.
  virtual bool elementwise() const = 0;

  int64_t steps() const { return step_; }
  void set_steps(int64_t s) { step_ = s; }

 protected:
  int64_t step_ = 0;
};

}  // namespace colossal::optim
