// ChunkStore: the one owner of parameter, gradient and optimizer memory (ARCHITECTURE.md). The model's
// parameters become views into chunk buffers laid out by ChunkLayout; gradients and optimizer states
// live beside them, full or as this rank's shard depending on the ZeRO stage:
//
//   stage  parameters  gradients                               optimizer states, master weights
//   0      full        full (.grad views, all-reduced)          full
//   1      full        full (.grad views, reduce-scattered)     shard
//   2      full        shard (each micro-batch's gradient       shard
//                      reduce-scattered, then dropped)
//   3      shard       as stage 2                               shard
//          (a block's chunks are gathered around its forward and its backward and released after;
//          chunks holding the embeddings, final norm or head stay whole)
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
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "src/memory/chunk_layout.h"
#include "src/memory/offloaded_states.h"
#include "src/memory/tensor_state.h"
#include "src/nn/module.h"
#include "src/optim/optimizer.h"

namespace colossal::memory {

// Optimizer offload to NVMe (ZeRO-Infinity's tiers on our chunks), set up before any value is written so
// the master weights never sit in memory whole: this rank's optimizer states (zeros until written) and,
// in mixed precision or with the parameters offloaded, its master weights live in a file under `dir`
// and come back through a few host staging buffers, in slices of at most `slice_numel` elements (0:
// whole chunks, which layer-wise rules need: a tensor's norms come from all its pieces at once).
// `params` (ZeRO-3 only): a block chunk's parameters keep no shard in memory between uses either; they
// are read from the master in the file when the block runs, so memory holds the embeddings, final norm
// and head and the few block chunks in use (ZeRO-Infinity's parameter offload).
struct StoreOffload {
  std::vector<std::string> state_names;
  std::string dir;
  int64_t slice_numel = kOffloadSliceNumel;
  bool params = false;
};

// Where a chunk's persistent data lives (Gemini's placement): on the compute device, or in host memory,
// from where a block's chunks are brought to the device as it runs and where the host optimizer updates
// them. Two residences per chunk: its parameter shard (ZeRO-3's releasable chunks; whole chunks stay on
// the device) and its optimizer side (gradient shard, master weights, optimizer states). On a machine
// without a GPU both are the same memory: the residence is then the accounting's, tensors do not move,
// and a device budget is what makes it matter (ZeroStrategy's placement).
enum class Residence : char { device, host };
struct StoreHomes {
  Residence params = Residence::device, states = Residence::device;
};

struct ChunkBytes {       // what this rank holds in memory, in bytes
  int64_t params = 0, grads = 0, optimizer = 0;
  int64_t staging = 0;    // of optimizer: the offload's aligned host buffers (not ATen allocations)
  int64_t host = 0;       // of the three: in host memory (a placement's offload, and the staging)
  int64_t nvme = 0;       // and in its offload file (not in total)
  int64_t total() const { return params + grads + optimizer; }
  int64_t device() const { return total() - host; }   // on the compute device
};

class ChunkStore {
 public:
  // Moves `module`'s trainable parameters into chunks of `chunk_numel` elements cut into `shards`
  // shards, of which this rank is `rank`. Stage 0 keeps one shard = the whole chunk. Allocated
  // parameters bring their current values; deferred ones (nn::ParamStorage::deferred) only their
  // shapes, and take their values through write().
  // `compute`: the dtype the model then computes in (undefined: its own, the master's).
  // `block_of`: the block a parameter belongs to, or -1 (ZeRO-3 releases chunks of block tensors only).
  // `device`: where the chunks live (undefined: where the parameters are; deferred ones are nowhere).
  // `offload`: what goes to NVMe (none: everything in memory). `homes`: where every chunk's persistent
  // data starts (set_homes moves it later). `compact`: under mixed precision at stage 2 or 3, keep the
  // gradient shards in the compute dtype (compact_grads) although the parameters are in memory.
  ChunkStore(nn::Module& module, int stage, int64_t chunk_numel, int64_t shards, int64_t rank,
             std::optional<at::ScalarType> compute = std::nullopt,
             const std::function<int64_t(const at::Tensor&)>& block_of = {},
             std::optional<c10::Device> device = std::nullopt, const std::optional<StoreOffload>& offload = std::nullopt,
             StoreHomes homes = {}, bool compact = false);

  // Slot's tensor takes `value` (its full value, any dtype and device) in whatever this rank holds of
  // it: the whole tensor in a present chunk, its part of a ZeRO-3 shard, its part of the fp32 master.
  // How initial and loaded values stream in one tensor at a time.
  void write(int64_t slot, const at::Tensor& value);

  int stage() const { return stage_; }
  c10::Device device() const { return master_options_.device(); }   // the compute device
  c10::Device device_of(Residence r) const { return r == Residence::host ? c10::Device(c10::kCPU) : device(); }
  Residence param_home(int64_t chunk) const { return param_home_[static_cast<size_t>(chunk)]; }
  Residence state_home(int64_t chunk) const { return state_home_[static_cast<size_t>(chunk)]; }
  // Moves chunk c's persistent data to `homes` (a copy between devices; on a CPU only the accounting
  // changes). Views handed out before (optimizer pieces) are stale after it.
  void set_homes(int64_t chunk, StoreHomes homes);
  // Of chunk c's bytes in host memory, its parameter shard's (the rest are its optimizer side's).
  int64_t host_param_bytes(int64_t chunk) const;
  int64_t rank() const { return rank_; }
  const ChunkLayout& layout() const { return layout_; }
  const std::vector<at::Tensor>& params() const { return params_; }   // full chunk buffers, compute dtype
  bool mixed() const { return mixed_; }                                // compute dtype != master dtype
  // This rank's master shard of chunk c (the model's dtype; a view of params() when not mixed). On
  // NVMe (master_on_disk), a copy read from the offload file: read it, do not change it.
  at::Tensor master_chunk(int64_t chunk);
  // The master weights live in the offload file (optimizer offload in mixed precision, or the
  // parameters offloaded), as its segment master_segment() after the states.
  bool master_on_disk() const { return master_on_disk_; }
  int master_segment() const { return static_cast<int>(offloaded_names_.size()); }
  // Chunk c's parameters are on NVMe between uses: materialize, then fill from the master's segment.
  bool params_on_disk(int64_t chunk) const { return params_on_disk_ && releasable(chunk); }
  bool params_offloaded() const { return params_on_disk_; }
  at::TensorOptions master_options() const { return master_options_; }
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
  // Parameters on NVMe in mixed precision, or asked for (the constructor's `compact`): the gradient
  // shards stay in the compute dtype (2 bytes per parameter instead of 4, what decides the largest
  // model when parameters and states are on disk, as in DeepSpeed's ZeRO-3, and 16 bytes a parameter
  // become 14 on the host when Gemini keeps the states there) and become master-dtype values as the update
  // reads them (widened in its pass by an optimizer that reads_half_grads, else a slice at a time);
  // master_grads() is then empty and collect_grads only notes the factor. One micro-batch per step
  // gives the same values as fp32 shards; accumulating several sums in the compute dtype.
  bool compact_grads() const { return (params_on_disk_ || compact_asked_) && mixed_ && stage_ >= 2; }
  // The gradients the update reads for [begin, begin + numel) of chunk c's shard: a view of
  // master_grads, or a converted copy (compact_grads).
  at::Tensor master_grad(int64_t chunk, int64_t begin, int64_t numel) const;
  // Multiplies the gradients the update will read by `factor` (clipping): compact ones as they convert.
  void scale_grads(double factor);
  double grad_factor() const { return compact_grads() ? grad_factor_ : 1.0; }   // what compact shards still owe
  // The compute chunks' shards take the updated master values (nothing to do when not mixed); with the
  // master offloaded, publish_range does it for each slice while it is staged.
  void publish();
  void publish_chunk(int64_t chunk);   // one chunk's part of publish()
  void publish_range(int64_t chunk, int64_t begin, const at::Tensor& master);
  // This rank's shard of optimizer state `name` for each chunk (zeros when first asked for); resident
  // states only (not offloaded).
  std::vector<at::Tensor>& state(const std::string& name);

  // The pieces of every tensor inside this rank's shards, with `state_names` states, for the optimizer.
  // `half_grads` as for range_pieces.
  std::vector<optim::ParamPiece> pieces(const std::vector<std::string>& state_names, double weight_decay, bool half_grads = false);
  // The pieces of the tensors in [begin, begin + numel) of this rank's shard of chunk c, with `master`
  // and `states` (one per state) views of that range. `half_grads`: the optimizer reads 16-bit
  // gradients (Optimizer::reads_half_grads), so compact shards are handed over as they are, with the
  // factor they owe in ParamPiece::grad_factor (ZeroStrategy::step_context refreshes it in the pieces it
  // keeps), instead of as a converted fp32 copy.
  std::vector<optim::ParamPiece> range_pieces(int64_t chunk, int64_t begin, int64_t numel, const at::Tensor& master,
                                              const std::vector<at::Tensor>& states, double weight_decay, bool half_grads = false);

  // The offload file (StoreOffload), or null. Segments of a slice: the states in state_names order,
  // then the master when master_on_disk.
  OffloadedStates* offloaded() { return offloaded_.get(); }
  const OffloadedStates* offloaded() const { return offloaded_.get(); }
  // Chunk c's states (this rank's shard, in state_names order): the tensors themselves in memory, or
  // copies read from the offload file (read them, do not change them).
  std::vector<at::Tensor> chunk_states(int64_t chunk, const std::vector<std::string>& state_names);
  // Writes `values` into state `name` of chunk c's shard from element `begin`, in memory or in the file.
  void write_state(int64_t chunk, const std::string& name, int64_t begin, const at::Tensor& values);

  TensorState tensor_state(int64_t slot) const { return states_[static_cast<size_t>(slot)]; }
  // Moves slot's tensor to `to` through the transition table (an Error naming it when not allowed).
  void set_state(int64_t slot, TensorState to);
  // The part of slot's tensor inside this rank's shard of its chunk (none when it lies outside).
  struct ShardPart {
    int64_t in_tensor = 0, in_shard = 0, numel = 0;   // offsets into the flat tensor and the shard
  };
  std::optional<ShardPart> shard_part(int64_t slot) const;
  int64_t block_of_slot(int64_t slot) const { return slot_block_[static_cast<size_t>(slot)]; }
  std::optional<int64_t> slot_of(const std::string& name) const;   // none: not a chunked parameter

  // ZeRO-3. A releasable chunk keeps only this rank's shard of its parameters (param_shard) between
  // uses; materialize gives its whole buffer memory again (to all-gather into; the model's parameters
  // and any views autograd saved are views of it), gathered marks its tensors held, release frees it.
  bool releasable(int64_t chunk) const { return releasable_[static_cast<size_t>(chunk)]; }
  bool present(int64_t chunk) const;
  const at::Tensor& materialize(int64_t chunk);
  void gathered(int64_t chunk);
  void release(int64_t chunk, bool keep_spare = true);   // keep_spare: as a spare buffer if the limit allows
  // This rank's shard of a chunk's parameters, compute dtype: what an all-gather sends (a copy read from
  // the file when params_on_disk).
  at::Tensor param_shard(int64_t chunk) const;
  void free_spares() { spare_.clear(); }   // the released chunks' memory kept for the next gathers
  // At most n spares per size from now on (1 under a device budget, whose accounting counts them).
  void set_spare_limit(size_t n);
  int64_t spare_bytes() const;   // the released chunks' memory kept now
  size_t spares_of(size_t nbytes) const;   // of which buffers of this size (a gather of that size takes one)
  void trim_spares(const std::map<size_t, size_t>& keep);   // at most keep[size] of each size (0 if absent)
  // What chunk c holds in memory (its file region in nvme); bytes() is their sum plus the staging buffers.
  ChunkBytes chunk_bytes(int64_t chunk) const;
  ChunkBytes bytes() const;   // what this rank holds now (stage 2's in-flight gradient chunks and spare gather buffers excluded)

 private:
  void write_master(int64_t chunk, int64_t begin, const at::Tensor& values);   // in memory or in the file
  // Chunk c's parameter shard in host memory (page-locked on a GPU machine), `value` or zeros.
  at::Tensor host_param_shard(int64_t chunk, const at::Tensor& value) const;
  // Chunk c's master weights and master gradients: views of its parameter and gradient shards where the
  // dtype and device allow, else buffers of their own on the optimizer side's device.
  void bind_master(int64_t chunk);

  int stage_;
  int64_t rank_;
  ChunkLayout layout_;
  std::vector<at::Tensor> tensors_;   // the model's parameters, by slot
  std::vector<TensorState> states_;   // by slot
  std::vector<int64_t> slot_block_;   // by slot: its block, or -1
  std::map<std::string, int64_t> slot_by_name_;
  std::vector<bool> releasable_;      // by chunk (ZeRO-3)
  std::vector<at::Tensor> param_shards_;   // by chunk: a releasable one's persistent shard
  bool mixed_ = false;
  at::TensorOptions master_options_;
  std::vector<at::Tensor> params_, master_, full_grads_, grad_shards_, master_grads_;
  std::vector<bool> master_own_;   // by chunk: master_ is a buffer of its own, not the parameter shard
  std::vector<Residence> param_home_, state_home_;   // by chunk
  std::map<std::string, std::vector<at::Tensor>> optimizer_states_;   // a map: references stay valid
  std::unique_ptr<OffloadedStates> offloaded_;   // the states on NVMe instead (optimizer offload)
  std::vector<std::string> offloaded_names_;
  bool master_on_disk_ = false, params_on_disk_ = false;
  bool compact_asked_ = false;   // the constructor's `compact`
  double grad_factor_ = 1.0;   // compact_grads: the factor their values still need
  std::map<size_t, std::vector<at::DataPtr>> spare_;   // released chunks' memory by size, for the next gather
  size_t spare_limit_;
};

// The trainable parameters of `module` as chunk specs, in registration (execution) order; decay for
// tensors of two or more dimensions, as GPT-2, nanoGPT and the HF recipes do.
std::vector<ChunkTensorSpec> chunk_specs(nn::Module& module);

// The block each parameter of `module` belongs to (-1: none), when it is a model with blocks; empty
// otherwise. What ChunkStore's `block_of` takes.
std::function<int64_t(const at::Tensor&)> parameter_blocks(nn::Module& module);

}  // namespace colossal::memory
