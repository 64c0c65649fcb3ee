// ZeroStrategy: data parallelism over the chunk store at ZeRO stage 0 (plain: every rank holds
// everything, gradients all-reduced), 1 (optimizer states sharded, gradients reduce-scattered once a
// step) or 2 (gradients sharded too: each micro-batch's gradient is reduce-scattered into the owning
// shard as its chunk completes and the full chunk dropped, so the full gradient never lives across
// micro-batches).
//
// A chunk is reduced the moment its last gradient is final, so communication overlaps the rest of
// backward (DDP's design, with chunks as buckets). Readiness comes from a post-hook on each parameter's
// gradient accumulator, which autograd runs after everything feeding that gradient has finished,
// including layers that sum their weight gradient straight into the .grad buffer
// (src/nn/gemm_choice.h). Chunks launch in the order they become ready: backward runs the same graph in
// the same order on every rank, so every rank launches the same sequence of collectives.
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "src/dist/group.h"
#include "src/memory/loss_scaler.h"
#include "src/memory/train_strategy.h"

namespace colossal::memory {

struct ZeroOptions {
  int stage = 0;
  int64_t chunk_numel = 1 << 20;
  double weight_decay = 0.0;                     // for tensors that take it (ChunkSlot::decay)
  std::optional<at::ScalarType> compute;         // mixed precision: the model computes in this dtype
  std::optional<LossScaleOptions> loss_scale;    // fp16: dynamic loss scaling
};

class ZeroStrategy : public TrainStrategy {
 public:
  ZeroStrategy(nn::Module& module, const ZeroOptions& options, dist::Group& group, std::unique_ptr<optim::Optimizer> optimizer);
  ~ZeroStrategy() override;
  ZeroStrategy(const ZeroStrategy&) = delete;
  ZeroStrategy& operator=(const ZeroStrategy&) = delete;

  void before_backward(bool last) override;
  void after_backward() override;
  at::Tensor scale_loss(const at::Tensor& loss) override;
  StepReport optimizer_step(double lr, double max_norm) override;
  std::map<std::string, std::string> scaler_state() const override;
  void load_scaler_state(const std::map<std::string, std::string>& state, const std::string& where) override;
  double loss_scale() const override { return scaler_ ? scaler_->scale() : 1.0; }
  int64_t skipped_steps() const override { return scaler_ ? scaler_->skipped() : 0; }
  ChunkStore& store() override { return store_; }

  // optimizer_step's parts, for tests that set gradients by hand (not mixed, no scaler): the global
  // norm of the gradients with clipping, the update with parameters made whole, and zeroing.
  double clip_grad_norm(double max_norm);
  void step(double lr);
  void zero_grad();
  optim::Optimizer& optimizer() override { return *optimizer_; }
  std::string describe() const override;

  // Under stages 1-2 each chunk's state shards are all-gathered one chunk at a time, so no rank holds
  // every state at once.
  void for_each_owned(const OwnedFn& fn) override;
  void load_state(int64_t slot, size_t k, const at::Tensor& full) override;

 private:
  struct ChunkSync {
    int64_t params = 0, waiting = 0;   // gradients it waits for; still outstanding this backward
    bool launched = false;
    dist::Pending pending;
    at::Tensor full, reduced;          // stage 2's gathered chunk; the shard a reduce-scatter fills
  };
  void ready(int64_t slot);
  void launch(int64_t chunk);
  void complete(int64_t chunk);

  dist::Group& group_;
  ChunkStore store_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::unique_ptr<LossScaler> scaler_;
  std::vector<optim::ParamPiece> pieces_;
  std::vector<ChunkSync> sync_;
  std::deque<int64_t> in_flight_;
  bool reducing_ = false;   // this backward's gradients are reduced
  struct Hooks;
  std::unique_ptr<Hooks> hooks_;
};

}  // namespace colossal::memory
