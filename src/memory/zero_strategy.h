// ZeroStrategy: data parallelism over the chunk store at ZeRO stage 0 (plain: every rank holds
// everything, gradients all-reduced), 1 (optimizer states sharded, gradients reduce-scattered once a
// step), 2 (gradients sharded too: each micro-batch's gradient is reduce-scattered into the owning
// shard as its chunk completes and the full chunk dropped, so the full gradient never lives across
// micro-batches) or 3 (parameters sharded too: a block's chunks are all-gathered before its forward
// and again before its backward, the next block's gather prefetched, and released after; a chunk
// released after forward or once its gradients are reduced).
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
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "src/dist/group.h"
#include "src/memory/allocation_counter.h"
#include "src/memory/chunk_trace.h"
#include "src/memory/device_copies.h"
#include "src/memory/loss_scaler.h"
#include "src/memory/overlapped_update.h"
#include "src/memory/train_strategy.h"
#include "src/nn/block_hooks.h"

namespace colossal::memory {

// Gemini's placement of the chunks (ZeRO-3's block chunks; see zero_placement.cpp):
// - device: every chunk's data on the compute device; block chunks gathered around their block and
//   released after (ZeRO-3 as such).
// - cpu: every chunk's parameter shard and optimizer side in host memory; a block's chunks are brought
//   to the device as it runs and dropped after; the host optimizer updates them there.
// - auto: the first step runs as cpu while its memory is measured (per block visit, what the device
//   holds beyond the chunks); then as many chunks' data as fit beside that peak move to the device, and
//   gathered chunks stay on it between uses while the budget allows, evicted by furthest next use on
//   the recorded access order.
// A device budget (device_limit) is enforced at every placement: chunks are evicted to keep within it,
// and a step that needs more than the budget even so ends the run with what it needed where.
enum class PlacementMode { device, cpu, automatic };
struct PlacementOptions {
  PlacementMode mode = PlacementMode::device;
  StoreHomes homes;            // where the chunks' data starts (cpu, auto's first step, offload_* = "cpu")
  int64_t device_limit = 0;    // bytes the compute device may hold at once (0: no budget, nothing measured)
  int64_t host_limit = 0;      // bytes the chunks may keep in host memory (0: no limit)
  bool keep_params_on_host = false, keep_states_on_host = false;   // offload_* = "cpu": auto moves them not
  // ATen's bytes on the training thread: on a CPU, where the compute device is host memory, what the
  // budget is held against (less what the chunks keep on the host). Required with a budget on a CPU.
  std::shared_ptr<AllocationCounter> counter;
};

// overlap_update: whether a step's update runs beside the next forward (overlapped_update.h). auto: where
// it pays, which is where the update does not compete with the forward for the same resource: the
// optimizer states on NVMe (the update waits on the disk), or on a GPU the states in host memory (the
// host updates while the GPU computes).
enum class OverlapUpdate { off, on, automatic };

struct ZeroOptions {
  int stage = 0;
  int64_t chunk_numel = 1 << 20;
  double weight_decay = 0.0;                     // for tensors that take it (ChunkSlot::decay)
  std::optional<at::ScalarType> compute;         // mixed precision: the model computes in this dtype
  std::optional<LossScaleOptions> loss_scale;    // fp16: dynamic loss scaling
  std::optional<c10::Device> device;             // where the chunks live (unset: where the parameters are)
  std::string offload_dir;                       // optimizer states on NVMe in a file here ("": in memory)
  int64_t offload_slice = kOffloadSliceNumel;    // elements staged at once (layer-wise optimizers: whole chunks)
  bool offload_params = false;                   // ZeRO-3: block chunks' parameters on NVMe too (needs offload_dir)
  // Mixed precision at stage 2 or 3 with one micro-batch a step: gradient shards in the compute dtype
  // (ChunkStore::compact_grads), taken where the optimizer reads_half_grads. The train plan asks for
  // it where the optimizer states live in host memory, whose bytes a parameter decide Gemini's largest
  // model; one micro-batch keeps the values those of fp32 shards (a reduced gradient lands on zeros).
  bool compact_grads = false;
  PlacementOptions placement;
  OverlapUpdate overlap_update = OverlapUpdate::off;
  // Tensor parallelism: the ranks holding the other pieces of the split parameters (nn::ShardSpec).
  // Norms (clipping's, and layer-wise optimizers' per tensor) sum over it, each piece counted once
  // however many ranks hold it. Null: no tensor parallelism.
  dist::Group* tensor_group = nullptr;
  // Pipeline parallelism: the ranks holding the other stages (clipping's norm sums over them), and the
  // tensors of which this stage holds a copy another stage counts (the head's copy of a tied embedding).
  dist::Group* pipeline_group = nullptr;
  std::vector<std::string> pipeline_copies;
};

class ZeroStrategy : public TrainStrategy {
 public:
  ZeroStrategy(nn::Module& module, const ZeroOptions& options, dist::Group& group, std::unique_ptr<optim::Optimizer> optimizer);
  ~ZeroStrategy() override;
  ZeroStrategy(const ZeroStrategy&) = delete;
  ZeroStrategy& operator=(const ZeroStrategy&) = delete;

  void before_backward(bool last) override;
  void after_backward() override;
  void before_forward() override;
  at::Tensor scale_loss(const at::Tensor& loss) override;
  StepReport optimizer_step(double lr, double max_norm) override;
  std::map<std::string, std::string> scaler_state() const override;
  void load_scaler_state(const std::map<std::string, std::string>& state, const std::string& where) override;
  double loss_scale() const override { return scaler_ ? scaler_->scale() : 1.0; }
  int64_t skipped_steps() const override { return scaler_ ? scaler_->skipped() : 0; }
  ChunkStore& store() override {   // its values are read: the update running beside the forward ends first
    finish_update();
    return store_;
  }

  // The hook for the model's block-hook chain (stages 1-3 on a model with blocks): waits for a block's
  // updated parameters before its forward; ZeRO-3 gathers its chunks before its forward and its backward
  // (prefetching the next block's) and releases them after.
  std::shared_ptr<nn::BlockHook> block_hook() const override { return gather_hook_; }
  // Every chunk whole and up to date, so the model's parameters can be read anywhere (ZeRO-3: a
  // collective); settle_chunks releases ZeRO-3's again (and any prefetch left over).
  void gather_all();
  void settle_chunks();

  // Whether optimizer_step's updates run beside the next forward (ZeroOptions::overlap_update).
  bool overlaps_update() const { return overlap_; }
  // optimizer_step's parts, for tests that set gradients by hand (not mixed, no scaler): the global
  // norm of the gradients with clipping, the update with parameters made whole, and zeroing.
  double clip_grad_norm(double max_norm);
  void step(double lr);
  void zero_grad();
  // The whole gradient of parameter `name` as autograd accumulated it (stages 0-1: a view of its chunk's
  // buffer, before the data-parallel reduction), for sums across ranks the strategy does not know of.
  at::Tensor full_grad(const std::string& name) override;
  optim::Optimizer& optimizer() override { return *optimizer_; }
  std::string describe() const override;
  // Placement under a device budget: the recorded access order (after the first step), the most the
  // device held in any window so far, and the chunks evicted to keep within the budget.
  const ChunkAccessTrace& access_trace() const { return trace_; }
  int64_t device_peak() const { return device_peak_all_; }
  int64_t evictions() const { return evictions_all_; }

  // Under stages 1-2 each chunk's state shards are all-gathered one chunk at a time, so no rank holds
  // every state at once.
  void for_each_owned(const OwnedFn& fn) override;
  void load_state(int64_t slot, size_t k, const at::Tensor& full) override;

 private:
  struct ChunkSync {
    int64_t params = 0, waiting = 0;   // gradients it waits for; still outstanding this backward
    bool launched = false;
    bool in_place = false;             // its tensors' .grad are views of `full` (sum_in_place)
    dist::Pending pending;
    at::Tensor full, reduced;          // stage 2's gathered chunk; the shard a reduce-scatter fills
  };
  void ready(int64_t slot);
  void launch(int64_t chunk);
  void complete(int64_t chunk);
  void complete_until(size_t in_flight);   // the oldest reductions, until at most `in_flight` remain
  void free_spares();   // the reused buffers of chunks, gradients and receives, before phases that use none
  // Stages 2-3: autograd sums the chunk's gradients into its full buffer through .grad views.
  void sum_in_place(int64_t chunk);
  class GatherHook;
  void enter_block(int64_t block, int direction);
  void leave_block(int64_t block, int direction);
  void fetch(int64_t chunk);     // start gathering (no wait): an all-gather, or a read from NVMe
  void ensure(int64_t chunk);    // gathered, waiting if needed
  void finish_disk_fetch(int64_t chunk);   // the read master in the compute chunk (all-gathered across ranks)
  bool all_held(int64_t chunk);
  void maybe_release(int64_t chunk);
  void wait_published(int64_t chunk);   // the all-gather after the last update, if still running
  void wait_published();
  // The update with the optimizer states on NVMe: slice by slice, the next slice's states read and the
  // last one's written back while this one is updated; the chunks in `order`, `done(c)` after each.
  void streamed_update(const optim::StepContext& ctx, const std::vector<int64_t>& order, const OverlappedUpdate::Done& done);
  optim::StepContext step_context(double lr);
  void update_chunks(const optim::StepContext& ctx, const std::vector<int64_t>& order, const OverlappedUpdate::Done& done);
  void publish_whole_chunks();   // more ranks: the all-gathers of the chunks ZeRO-3 keeps whole
  // overlap_update: the update on its own thread, in the order the next forward reads the chunks
  // (update_order_); the forward waits for each chunk where it first reads it (wait_published, ensure).
  std::string overlap_blocker(const ZeroOptions& o) const;   // why the update cannot overlap here ("": it can)
  void start_update(double lr);
  void finish_update() { overlapped_.finish(); }
  bool overlap_ = false;
  int update_threads_ = 1;
  std::vector<int64_t> update_order_;
  OverlappedUpdate overlapped_;
  double last_update_s_ = 0;   // the last overlapped update's own seconds, for the next step report
  std::string offload_how() const;   // "io_uring, O_DIRECT"
  int64_t offload_read() const;      // bytes through the offload file so far
  int64_t offload_written() const;
  int64_t reported_read_ = 0, reported_written_ = 0;   // offload bytes counted in step reports so far
  bool counting_io_ = false;

  dist::Group& group_;
  dist::Group* tensor_group_ = nullptr;   // with at least two ranks, else null
  dist::Group* pipeline_group_ = nullptr;   // with at least two stages, else null
  std::vector<int64_t> pipeline_copies_;    // slots another stage counts in the norm
  // Under tensor parallelism, each tensor's share in sums over the group: 1 / the ranks holding the same
  // piece (nn::ShardSpec::copies), so a sum over the group counts every element once.
  std::vector<double> slot_weight_;
  std::vector<std::pair<int64_t, double>> held_by_several_;   // the slots whose weight is below 1
  // This rank's shard's squared gradient norm, less what the tensors held by several ranks count too often.
  double excess_squares(const std::vector<at::Tensor>& grads) const;
  ChunkStore store_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::unique_ptr<LossScaler> scaler_;
  std::vector<optim::ParamPiece> pieces_;   // every chunk's, when the states are in memory
  double weight_decay_ = 0;
  double grad_scale_ = 1;   // clipping's scale, left for an optimizer that folds it into its update
  std::vector<ChunkSync> sync_;
  std::deque<int64_t> in_flight_;
  int64_t launched_ = 0;                   // reductions launched so far
  int64_t launched_before_block_ = 0;      // launched_ when the running block's backward began
  SpareBuffers spare_grads_;   // stage 2-3's full gradient chunks and every stage's reduced shards, reused
  bool reducing_ = false;   // this backward's gradients are reduced
  // ZeRO-3
  std::vector<std::vector<int64_t>> block_chunks_;   // releasable chunks each block uses
  std::vector<std::vector<int64_t>> block_whole_chunks_;   // and the whole ones
  std::vector<std::vector<int64_t>> block_slots_;          // each block's tensors in releasable chunks
  std::vector<int64_t> outer_chunks_;                 // whole chunks holding tensors outside the blocks
  std::vector<dist::Pending> publishing_;            // all-gathers of updated parameters, by chunk
  std::vector<int> refs_;                            // blocks running on each chunk
  std::vector<dist::Pending> fetches_;
  struct DiskFetch {                                 // offload_params: a chunk's master read from NVMe
    AlignedBuffer buffer;
    OffloadedStates::SegmentRead read;
  };
  std::vector<DiskFetch> disk_fetches_;              // by chunk
  std::map<int64_t, std::vector<AlignedBuffer>> read_buffers_;   // their buffers by size, reused
  std::vector<bool> fetching_;
  std::vector<int64_t> upcoming_;                    // chunks of the block expected next
  // On a GPU: parameter shards in host memory come over (one rank; more gather through their
  // collective), and reduced gradients for host shards go back (any ranks), on a side stream
  // (device_copies.h), so neither forward nor backward makes the host wait for the GPU.
  DeviceCopies copies_;
  std::vector<CopyTicket> param_copies_;   // by chunk: its shard on its way to the device
  struct GradCopy {                        // a reduced gradient shard on its way to host memory
    int64_t chunk = 0;
    at::Tensor reduced, staging;           // the device shard (kept until read), its page-locked copy
    CopyTicket ticket;
  };
  std::deque<GradCopy> grad_copies_;       // in reduction order
  SpareBuffers grad_staging_;              // finished copies' page-locked buffers, reused
  void copy_grad_to_host(int64_t chunk, at::Tensor reduced);
  void finish_grad_copies(size_t pending);   // the oldest added into their shards until at most `pending` remain
  // Placement (zero_placement.cpp). A window runs from one block visit's start to the next one's.
  PlacementOptions placement_;
  bool metered() const { return placement_.device_limit > 0; }
  int64_t take_device_peak();           // the most it held since the last call
  int64_t chunk_device_bytes() const;   // the chunks' bytes on the device, their spare buffers included
  int64_t whole_bytes(int64_t chunk) const;             // a gathered chunk's
  std::vector<int64_t> visit_chunks(size_t visit) const;   // a recorded visit's chunks and the next one's
  void placement_enter(int64_t block, int direction);   // before a visit's chunks are gathered
  void placement_entered();             // after: its window's chunks are in place
  void close_window();
  void plan_placement();                // after the first step: homes and caching (auto)
  void make_room(size_t visit);         // evicts cached chunks until the visit's window fits the budget
  bool droppable(int64_t chunk);        // a gathered block chunk no block is using
  void drop_cached();                   // before an update: every cached chunk goes
  void check_budget(int64_t peak, const std::string& where) const;
  ChunkAccessTrace trace_;
  std::vector<int64_t> window_extra_;   // by visit (first step): the device's peak beyond the chunks
  size_t visit_ = 0;
  bool in_window_ = false, recording_ = false, first_step_done_ = false, caching_ = false;
  int64_t window_block_ = 0;            // the running window's visit
  int window_direction_ = 0;
  bool window_recorded_ = false;        // part of the first step's record (not an evaluation)
  int64_t window_chunks_ = 0;           // device bytes of the chunks as the running window began
  int64_t plan_limit_ = 0;              // the budget less a margin for allocator rounding
  int64_t device_peak_ = 0, evictions_ = 0;             // since the last step report
  int64_t device_peak_all_ = 0, evictions_all_ = 0;     // since the start
  std::shared_ptr<nn::BlockHook> gather_hook_;
  struct Hooks;
  std::unique_ptr<Hooks> hooks_;
};

}  // namespace colossal::memory
