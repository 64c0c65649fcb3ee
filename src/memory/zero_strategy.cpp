// ZeRO stages 0-3 over the chunk store: see zero_strategy.h (ZeRO-3's gathering: zero_gather.cpp).
#include "src/memory/zero_strategy.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "kernels/cpu/accumulate.h"
#include "kernels/cpu/adamw.h"
#include "src/core/device.h"
#include "src/core/error.h"
#include "src/core/text.h"
#include "src/memory/sum_of_squares.h"
#include "src/nn/block.h"
#include "src/nn/model.h"

namespace colossal::memory {
namespace {

// Stage 2 keeps at most this many chunks' full gradients waiting on their reduce-scatter: enough to
// overlap communication with backward (with 2, backward stalled on the oldest at GPT-2 124M), few
// enough that the full gradient never accumulates.
constexpr size_t kStage2InFlight = 4;
// Reduced gradient shards on their way to host memory (a GPU's placement) before the host waits for the
// oldest: enough to keep the copy stream busy, few enough that their page-locked buffers stay small.
constexpr size_t kGradCopiesInFlight = 4;

// Runs after a parameter's gradient accumulator: the parameter's gradient for this backward is final.
class ReadyHook : public torch::autograd::FunctionPostHook {
 public:
  explicit ReadyHook(std::function<void()> on_ready) : on_ready_(std::move(on_ready)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    on_ready_();
    return outputs;
  }

 private:
  std::function<void()> on_ready_;
};

}  // namespace

struct ZeroStrategy::Hooks {
  using Accumulator = decltype(torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor&>()));
  std::vector<std::pair<Accumulator, uintptr_t>> installed;   // kept alive: autograd holds them weakly
};

namespace {

// The block each parameter of `module` belongs to, when it is a model with blocks (ZeRO-3 needs them;
// stages 1-2 use them to wait for each block's updated parameters only when the block runs; at every
// stage the store answers it for the memory profile's per-block figures).
std::function<int64_t(const at::Tensor&)> block_map(nn::Module& module, int stage) {
  auto* model = dynamic_cast<nn::Model*>(&module);
  if (stage == 3 && (!model || model->blocks().empty()))
    throw Error("zero: stage 3 gathers parameters block by block, and this module has no blocks");
  return parameter_blocks(module);
}

// What the chunk store puts on NVMe: nothing without an offload directory.
std::optional<StoreOffload> offload_plan(const ZeroOptions& o, const optim::Optimizer& optimizer) {
  if (o.offload_dir.empty()) {
    if (o.offload_params) throw Error("zero: parameters on NVMe need an offload directory (internal)");
    return std::nullopt;
  }
  if (optimizer.state_names().empty())
    throw Error("offload_optimizer = \"nvme\": " + optimizer.name() + " as configured keeps no optimizer state to offload (set it to \"none\")");
  if (o.offload_params && o.stage != 3)
    throw Error("offload_params = \"nvme\" needs zero = 3: parameters are brought in block by block (zero = " + std::to_string(o.stage) + ")");
  StoreOffload plan;
  plan.state_names = optimizer.state_names();
  plan.dir = o.offload_dir;
  // Elementwise rules stream slices of a few million elements; layer-wise ones whole chunks (a tensor's
  // norms need all of it in one update call).
  plan.slice_numel = optimizer.elementwise() ? o.offload_slice : 0;
  plan.params = o.offload_params;
  return plan;
}

// shard += part: a gradient reduced in the compute dtype added into its fp32 shard in host memory
// through accumulate.h's loop (6.5x ATen's mixed-dtype add), else by ATen (a compact shard in the
// compute dtype: one micro-batch's reduced gradient lands on zeros, exactly).
void accumulate_grad(at::Tensor& shard, const at::Tensor& part) {
  const bool half = part.scalar_type() == at::kBFloat16 || part.scalar_type() == at::kHalf;
  if (half && shard.is_cpu() && part.is_cpu() && shard.scalar_type() == at::kFloat && shard.is_contiguous() && part.is_contiguous() &&
      shard.numel() == part.numel()) {
    kernels::accumulate_half(shard.data_ptr<float>(), static_cast<const uint16_t*>(part.const_data_ptr()), shard.numel(),
                             part.scalar_type() == at::kBFloat16 ? kernels::Half16::bf16 : kernels::Half16::fp16);
    return;
  }
  shard.add_(part.to(shard.device()));
}

}  // namespace

// Tells the strategy when each block runs (ZeRO-3's gather and release): the first hook of the chain.
class ZeroStrategy::GatherHook : public nn::BlockHook {
 public:
  explicit GatherHook(ZeroStrategy* z) : z_(z) {}
  void before_forward(int64_t b) override { z_->enter_block(b, +1); }
  void after_forward(int64_t b) override { z_->leave_block(b, +1); }
  void before_backward(int64_t b) override { z_->enter_block(b, -1); }
  void after_backward(int64_t b) override { z_->leave_block(b, -1); }

 private:
  ZeroStrategy* z_;
};

ZeroStrategy::ZeroStrategy(nn::Module& module, const ZeroOptions& o, dist::Group& group, std::unique_ptr<optim::Optimizer> optimizer)
    : group_(group),
      store_(module, o.stage, o.chunk_numel, group.size(), group.rank(), o.compute, block_map(module, o.stage), o.device,
             offload_plan(o, *optimizer), o.placement.homes, o.compact_grads && optimizer->reads_half_grads()),
      optimizer_(std::move(optimizer)),
      scaler_(o.loss_scale ? std::make_unique<LossScaler>(*o.loss_scale) : nullptr),
      spare_grads_(kStage2InFlight + 1),
      copies_(store_.device()),
      grad_staging_(kGradCopiesInFlight + 1),
      hooks_(std::make_unique<Hooks>()) {
  weight_decay_ = o.weight_decay;
  if (o.tensor_group && o.tensor_group->size() > 1) {
    tensor_group_ = o.tensor_group;
    slot_weight_.assign(store_.layout().slots.size(), 1.0);
    for (const auto& item : module.named_parameters())
      if (auto slot = store_.slot_of(item.key())) {
        const double w = 1.0 / static_cast<double>(item.shard().copies(tensor_group_->size()));
        slot_weight_[static_cast<size_t>(*slot)] = w;
        if (w < 1) held_by_several_.emplace_back(*slot, w);
      }
  }
  if (o.pipeline_group && o.pipeline_group->size() > 1) {
    pipeline_group_ = o.pipeline_group;
    for (const auto& name : o.pipeline_copies)
      if (auto slot = store_.slot_of(name)) pipeline_copies_.push_back(*slot);
  }
  if (!store_.offloaded()) pieces_ = store_.pieces(optimizer_->state_names(), o.weight_decay, optimizer_->reads_half_grads());
  placement_ = o.placement;
  if (placement_.mode != PlacementMode::device && o.stage != 3)
    throw Error("zero: a placement other than \"device\" needs stage 3: chunks are brought to the device block by block (internal)");
  if (metered()) {
    if (o.stage != 3) throw Error("zero: a device budget needs stage 3 (internal)");
    if (store_.device().is_cpu() && !placement_.counter) throw Error("zero: a device budget on a CPU needs an allocation counter (internal)");
    // One spare buffer per size: an evicted chunk's memory is what the next gathered chunk takes (freed
    // and allocated again, a large chunk is page faults and zeroing on every gather), and the placement
    // counts it as the chunks' (chunk_device_bytes).
    store_.set_spare_limit(1);
    plan_limit_ = placement_.device_limit - placement_.device_limit / 32;   // a margin for the allocator's rounding
    recording_ = true;
  }
  const ChunkBytes held = store_.bytes();
  if (placement_.host_limit > 0 && held.host > placement_.host_limit)
    throw Error("host_memory_limit_gb: the chunks keep " + human_bytes(static_cast<double>(held.host)) +
                " in host memory, over the limit of " + human_bytes(static_cast<double>(placement_.host_limit)) +
                " (offload them to NVMe with offload_optimizer = \"nvme\", or raise host_memory_limit_gb)");
  const auto& layout = store_.layout();
  sync_.resize(static_cast<size_t>(layout.chunks()));
  const auto chunks = static_cast<size_t>(layout.chunks());
  publishing_.resize(chunks);
  if (o.stage >= 1) {
    // Which chunks each block reads: ZeRO-3 gathers the releasable ones around the block; at every stage
    // from 1 the whole ones, all-gathered after each update, are waited for only when first read (a
    // block's before its forward, the embeddings' and head's at before_forward), so the gather overlaps
    // the start of the next forward.
    int64_t blocks = 0;   // the store knows each tensor's block (none without a model with blocks)
    for (int64_t i = 0; i < static_cast<int64_t>(layout.slots.size()); ++i) blocks = std::max(blocks, store_.block_of_slot(i) + 1);
    block_chunks_.resize(static_cast<size_t>(blocks));
    block_whole_chunks_.resize(static_cast<size_t>(blocks));
    block_slots_.resize(static_cast<size_t>(blocks));
    for (int64_t i = 0; i < static_cast<int64_t>(layout.slots.size()); ++i) {
      const int64_t b = store_.block_of_slot(i), c = layout.slots[static_cast<size_t>(i)].chunk;
      if (b >= 0 && store_.releasable(c)) block_slots_[static_cast<size_t>(b)].push_back(i);
      auto& list = b < 0 ? outer_chunks_ : (store_.releasable(c) ? block_chunks_ : block_whole_chunks_)[static_cast<size_t>(b)];
      if (std::find(list.begin(), list.end(), c) == list.end()) list.push_back(c);
    }
    refs_.assign(chunks, 0);
    fetches_.resize(chunks);
    param_copies_.resize(chunks);
    fetching_.assign(chunks, false);
    if (blocks > 0) gather_hook_ = std::make_shared<GatherHook>(this);
  }
  // The update's order for overlap_update: the chunks the forward reads first (embeddings, final norm
  // and head at before_forward), then each block's, block by block.
  std::vector<bool> ordered(chunks, false);
  const auto add = [&](int64_t c) {
    if (!ordered[static_cast<size_t>(c)]) update_order_.push_back(c);
    ordered[static_cast<size_t>(c)] = true;
  };
  for (int64_t c : outer_chunks_) add(c);
  for (size_t b = 0; b < block_chunks_.size(); ++b) {
    for (int64_t c : block_whole_chunks_[b]) add(c);
    for (int64_t c : block_chunks_[b]) add(c);
  }
  for (int64_t c = 0; c < layout.chunks(); ++c) add(c);
  if (o.overlap_update != OverlapUpdate::off) {
    const std::string blocker = overlap_blocker(o);
    if (o.overlap_update == OverlapUpdate::on && !blocker.empty())
      throw Error("overlap_update = \"on\": " + blocker + " (set overlap_update = \"auto\" or \"off\")");
    // auto: where the update and the forward wait on different things (the disk and the CPU, the host
    // and the GPU); on one CPU with the states in memory both would share its cores.
    const bool pays = store_.offloaded() || (!store_.device().is_cpu() && o.placement.homes.states == Residence::host);
    overlap_ = blocker.empty() && (o.overlap_update == OverlapUpdate::on || pays);
    // On a CPU the forward keeps the cores and the update waits on the disk: one thread for it. Beside a
    // GPU the host's cores are the update's but the one launching the forward.
    update_threads_ = store_.device().is_cpu() ? 1 : std::max(1, at::get_num_threads() - 1);
  }
  // One process at stage 0 has nothing to reduce; every other case moves gradients through the hooks
  // (stage 2 also at one rank: its gradients live in the shard, not in .grad).
  if (o.stage == 0 && !group_.active()) return;
  for (int64_t i = 0; i < static_cast<int64_t>(layout.slots.size()); ++i) {
    const at::Tensor& p = store_.param_of(i);
    ++sync_[static_cast<size_t>(layout.slots[static_cast<size_t>(i)].chunk)].params;
    auto acc = torch::autograd::impl::grad_accumulator(p);
    if (!acc) throw Error("zero: parameter without a gradient accumulator (internal)");
    auto key = acc->add_post_hook(std::make_unique<ReadyHook>([this, i] { ready(i); }));
    hooks_->installed.emplace_back(acc, key);
  }
}

ZeroStrategy::~ZeroStrategy() {
  for (auto& [acc, key] : hooks_->installed) acc->del_post_hook(key);
  try {
    wait_published();   // no update or collective left writing into the chunks
  } catch (const std::exception&) {
    // The job is ending with an error already reported; the chunks die with it.
  }
}

int64_t ZeroStrategy::offload_read() const { return store_.offloaded() ? store_.offloaded()->file().bytes_read() : 0; }
int64_t ZeroStrategy::offload_written() const { return store_.offloaded() ? store_.offloaded()->file().bytes_written() : 0; }

std::string ZeroStrategy::offload_how() const {
  const OffloadFile& f = store_.offloaded()->file();
  return std::string(f.io_uring() ? "io_uring" : "pread/pwrite") + (f.direct() ? ", O_DIRECT" : ", page cache");
}

std::string ZeroStrategy::describe() const {
  const auto& l = store_.layout();
  const ChunkBytes b = store_.bytes();
  const std::string placement = placement_.mode == PlacementMode::cpu         ? ", placement cpu"
                                : placement_.mode == PlacementMode::automatic ? ", placement auto"
                                                                              : "";
  const std::string overlap = overlap_ ? ", each update beside the next forward" : "";
  const std::string budget = metered() ? " within a device budget of " + human_bytes(static_cast<double>(placement_.device_limit)) : "";
  return "ZeRO stage " + std::to_string(store_.stage()) + (store_.stage() == 0 ? " (plain data parallelism)" : "") + placement + budget + overlap + " over " +
         std::to_string(group_.size()) + " rank(s): " + std::to_string(l.chunks()) + " chunk(s) of " +
         human_count(static_cast<double>(l.chunk_numel)) + " elements (" + human_bytes(static_cast<double>(l.padding()) * 4) +
         " padding); this rank holds " + human_bytes(static_cast<double>(b.params)) + " parameters, " +
         human_bytes(static_cast<double>(b.grads)) + " gradients, " + human_bytes(static_cast<double>(b.optimizer)) + " optimizer states" +
         (b.host > b.staging ? " (" + human_bytes(static_cast<double>(b.host - b.staging)) + " of it in host memory)" : "") +
         (b.nvme > 0 ? " (staging; " + human_bytes(static_cast<double>(b.nvme)) + " of optimizer states" +
                           (store_.master_on_disk() ? " and master weights" : "") + " on NVMe" +
                           (store_.params_offloaded() ? "; block parameters read from there as each block runs" : "") +
                           (store_.compact_grads() ? "; gradient shards kept in the compute dtype" : "") + ", " +
                           offload_how() + ")"
                     : store_.compact_grads() ? " (gradient shards kept in the compute dtype)"
                                              : "");
}

void ZeroStrategy::before_backward(bool last) {
  reducing_ = hooks_->installed.size() > 0 && (last || store_.stage() >= 2);
  if (!reducing_) return;
  for (auto& s : sync_) {
    s.waiting = s.params;
    s.launched = false;
  }
  // From stage 2 the chunks holding the embeddings, final norm or head collect gradients from both
  // ends of backward (GPT-2's tied embedding: the head's first, the lookup's last), so their buffer
  // lives through backward anyway: it is given to autograd as the tensors' .grad from the start.
  // A block's chunks get theirs as the block's backward begins (enter_block). A module without blocks
  // has every chunk outside them: its gradients keep arriving as tensors, copied into a buffer taken
  // as each chunk's first one comes, so at most the in-flight window is ever full.
  if (store_.stage() < 2 || !gather_hook_) return;
  for (int64_t c : outer_chunks_) sum_in_place(c);
}

void ZeroStrategy::sum_in_place(int64_t c) {
  // Every contribution is then summed into the buffer where it is computed (the layers' weight
  // gradients accumulate into .grad, grad_buffer_of), rather than arriving as a tensor of its own,
  // freshly allocated (page faults on every step's gradients) and copied into the buffer: ZeRO-2 ran
  // at 0.93x of plain data parallelism at GPT-2 350M with the copies.
  auto& cs = sync_[static_cast<size_t>(c)];
  if (cs.full.defined() || !reducing_) return;   // in place already, or collecting by copies
  at::NoGradGuard no_grad;
  cs.full = spare_grads_.take(store_.layout().chunk_sizes[static_cast<size_t>(c)], store_.params()[static_cast<size_t>(c)].options());
  cs.full.zero_();
  for (int64_t i : store_.layout().chunk_slots[static_cast<size_t>(c)]) {
    const auto& t = store_.layout().slots[static_cast<size_t>(i)];
    at::Tensor p = store_.param_of(i);
    p.mutable_grad() = cs.full.narrow(0, t.offset, t.numel).view(p.sizes());
  }
  cs.in_place = true;
}

void ZeroStrategy::ready(int64_t slot) {
  finish_update();   // a gradient is final: the update reading and zeroing the last ones must be done
  const auto& s = store_.layout().slots[static_cast<size_t>(slot)];
  auto& cs = sync_[static_cast<size_t>(s.chunk)];
  if (store_.stage() >= 2) {
    // Move this micro-batch's gradient into its chunk's full buffer and drop the tensor autograd made.
    at::Tensor p = store_.param_of(slot);
    if (!cs.full.defined()) {   // every tensor's range is written (or zeroed at launch); the tail is padding
      const auto& tensors = store_.layout().chunk_slots[static_cast<size_t>(s.chunk)];
      const auto& last = store_.layout().slots[static_cast<size_t>(tensors.back())];
      const int64_t size = store_.layout().chunk_sizes[static_cast<size_t>(s.chunk)], used = last.offset + last.numel;
      cs.full = spare_grads_.take(size, p.options());
      cs.full.narrow(0, used, size - used).zero_();
    }
    at::Tensor range = cs.full.narrow(0, s.offset, s.numel);
    if (cs.in_place) {
      // summed in place already (before_backward)
    } else if (p.grad().defined()) {
      range.copy_(p.grad().reshape({-1}));
      p.mutable_grad().reset();
    } else {
      range.zero_();
    }
  }
  if (!reducing_) return;
  store_.set_state(slot, TensorState::ready_for_reduce);
  if (--cs.waiting == 0 && !cs.launched) launch(s.chunk);
}

void ZeroStrategy::launch(int64_t chunk) {
  auto& cs = sync_[static_cast<size_t>(chunk)];
  cs.launched = true;
  const int stage = store_.stage();
  at::Tensor whole = stage >= 2 ? cs.full : store_.full_grads()[static_cast<size_t>(chunk)];
  if (!whole.defined()) whole = cs.full = at::zeros_like(store_.params()[static_cast<size_t>(chunk)]);   // no gradient reached it
  if (stage >= 2)   // tensors whose gradient never came this backward: zeros, not what the buffer held
    for (int64_t i : store_.layout().chunk_slots[static_cast<size_t>(chunk)])
      if (store_.tensor_state(i) != TensorState::ready_for_reduce) {
        const auto& t = store_.layout().slots[static_cast<size_t>(i)];
        whole.narrow(0, t.offset, t.numel).zero_();
      }
  // Average as a sum of pre-scaled parts: the scaling runs here, overlapped with backward.
  if (group_.size() > 1) whole.mul_(1.0 / static_cast<double>(group_.size()));
  const std::string what = "gradient chunk " + std::to_string(chunk);
  if (stage == 0) {
    cs.pending = group_.all_reduce_async(whole, what);
  } else {
    cs.reduced = spare_grads_.take(store_.shard_numel(chunk), whole.options());
    cs.pending = group_.reduce_scatter_async(cs.reduced, whole, what);
  }
  in_flight_.push_back(chunk);
  ++launched_;
  if (stage >= 2) complete_until(kStage2InFlight);
}

void ZeroStrategy::complete_until(size_t in_flight) {
  while (in_flight_.size() > in_flight) {
    complete(in_flight_.front());
    in_flight_.pop_front();
  }
}

void ZeroStrategy::complete(int64_t chunk) {
  auto& cs = sync_[static_cast<size_t>(chunk)];
  group_.wait(cs.pending);
  at::Tensor& shard = store_.grad_shards()[static_cast<size_t>(chunk)];
  if (store_.stage() == 1) shard.copy_(cs.reduced);
  if (store_.stage() >= 2 && copies_.active() && shard.is_cpu() && cs.reduced.is_cuda()) {
    copy_grad_to_host(chunk, std::move(cs.reduced));   // added into the shard once it has come over
  } else {
    if (store_.stage() >= 2)   // accumulates over the step's micro-batches (in host memory under a placement's offload)
      accumulate_grad(shard, cs.reduced);
    spare_grads_.give(std::move(cs.reduced));
  }
  cs.reduced = at::Tensor();
  if (cs.in_place)   // the tensors' .grad views go with the buffer
    for (int64_t i : store_.layout().chunk_slots[static_cast<size_t>(chunk)]) store_.param_of(i).mutable_grad().reset();
  cs.in_place = false;
  if (store_.stage() >= 2) spare_grads_.give(std::move(cs.full));   // for the next chunk of its size
  cs.full = at::Tensor();
  for (int64_t i : store_.layout().chunk_slots[static_cast<size_t>(chunk)])
    if (store_.tensor_state(i) == TensorState::ready_for_reduce) store_.set_state(i, TensorState::hold);
  if (store_.stage() == 3) maybe_release(chunk);   // its gradients are reduced: its parameters can go
}

void ZeroStrategy::after_backward() {
  if (!reducing_) return;
  reducing_ = false;
  for (int64_t c = 0; c < static_cast<int64_t>(sync_.size()); ++c)
    if (!sync_[static_cast<size_t>(c)].launched) launch(c);   // chunks some of whose tensors got no gradient
  complete_until(0);
  finish_grad_copies(0);
  if (store_.stage() == 3) settle_chunks();
}

void ZeroStrategy::copy_grad_to_host(int64_t chunk, at::Tensor reduced) {
  at::Tensor staging = grad_staging_.take(reduced.numel(), at::TensorOptions().dtype(reduced.scalar_type()),
                                          [&] { return page_locked_empty(reduced.numel(), reduced.scalar_type()); });
  CopyTicket ticket = copies_.copy(staging, reduced);
  grad_copies_.push_back({chunk, std::move(reduced), std::move(staging), std::move(ticket)});
  finish_grad_copies(kGradCopiesInFlight);
}

void ZeroStrategy::finish_grad_copies(size_t pending) {
  // Oldest first, so a chunk's micro-batches add up in the order they were reduced (the CPU's order).
  // Only past `pending`, never as soon as one is done: the device shards they hold are then the same at
  // every step, whatever the GPU's pace, so the first step's measured windows hold for the placement.
  while (grad_copies_.size() > pending) {
    GradCopy& g = grad_copies_.front();
    copies_.host_waits(g.ticket);
    {
      at::NoGradGuard no_grad;
      accumulate_grad(store_.grad_shards()[static_cast<size_t>(g.chunk)], g.staging);
    }
    spare_grads_.give(std::move(g.reduced));   // read by the copy: the compute stream may reuse it now
    grad_staging_.give(std::move(g.staging));
    grad_copies_.pop_front();
  }
}

void ZeroStrategy::free_spares() {
  // The buffers backward reused (gathered chunks, full gradient chunks, receive buffers) sit idle
  // through the update and a checkpoint, the phases where a rank's memory peaks (at GPT-2 medium's
  // width, eight or more chunks): freed here, they come back from malloc as the next forward gathers.
  store_.free_spares();
  read_buffers_.clear();
  spare_grads_.clear();
  group_.free_spares();
}

at::Tensor ZeroStrategy::scale_loss(const at::Tensor& loss) { return scaler_ ? loss * scaler_->scale() : loss; }

void ZeroStrategy::streamed_update(const optim::StepContext& ctx, const std::vector<int64_t>& order, const OverlappedUpdate::Done& done) {
  OffloadedStates& states = *store_.offloaded();
  const size_t names = optimizer_->state_names().size();
  std::vector<int64_t> sequence;   // the slices, chunk by chunk in `order`
  for (int64_t c : order)
    for (int64_t s = states.first_slice(c); s < states.first_slice(c + 1); ++s) sequence.push_back(s);
  if (!sequence.empty()) states.prefetch(sequence.front());
  for (size_t i = 0; i < sequence.size(); ++i) {
    const int64_t s = sequence[i];
    if (i + 1 < sequence.size()) states.prefetch(sequence[i + 1]);
    const auto& staged = states.acquire(s, true);
    const auto& sl = states.slice(s);
    // Chunks on a GPU are updated there: the staged slice goes to the device and comes back.
    const c10::Device device = store_.grad_shards()[static_cast<size_t>(sl.chunk)].device();
    std::vector<at::Tensor> work(staged.begin(), staged.end());
    if (!device.is_cpu())
      for (auto& t : work) t = t.to(device);
    // The master: staged with the states when it lives on disk, else the parameters' own shard.
    const at::Tensor master = store_.master_on_disk() ? work.back() : store_.master_chunk(sl.chunk).narrow(0, sl.begin, sl.numel);
    const std::vector<at::Tensor> slice_states(work.begin(), work.begin() + static_cast<std::ptrdiff_t>(names));
    auto pieces = store_.range_pieces(sl.chunk, sl.begin, sl.numel, master, slice_states, weight_decay_, optimizer_->reads_half_grads());
    optimizer_->update(pieces, ctx);
    store_.publish_range(sl.chunk, sl.begin, master);   // mixed precision: the compute chunk takes it while it is staged
    if (!device.is_cpu())
      for (size_t k = 0; k < work.size(); ++k) staged[k].copy_(work[k]);
    states.writeback(s);
    if (s + 1 == states.first_slice(sl.chunk + 1)) done(sl.chunk);
  }
}

void ZeroStrategy::update_chunks(const optim::StepContext& ctx, const std::vector<int64_t>& order, const OverlappedUpdate::Done& done) {
  if (store_.offloaded()) {
    streamed_update(ctx, order, [&](int64_t c) {
      store_.publish_chunk(c);
      done(c);
    });
    return;
  }
  std::vector<std::vector<optim::ParamPiece>> by_chunk(static_cast<size_t>(store_.layout().chunks()));
  for (const auto& piece : pieces_)
    by_chunk[static_cast<size_t>(store_.layout().slots[static_cast<size_t>(piece.tensor)].chunk)].push_back(piece);
  for (int64_t c : order) {
    optimizer_->update(by_chunk[static_cast<size_t>(c)], ctx);
    store_.publish_chunk(c);
    done(c);
  }
}

TrainStrategy::StepReport ZeroStrategy::optimizer_step(double lr, double max_norm) {
  StepReport r;
  if (overlap_) {   // the last step's update (its backward has waited for it already)
    finish_update();
    last_update_s_ = overlapped_.last_run_s();
    r.update_wait_s = overlapped_.take_waited();
  }
  free_spares();
  r.loss_scale = loss_scale();   // the scale this step's loss was multiplied by, before the scaler updates it
  store_.collect_grads(1.0 / r.loss_scale);
  const auto t0 = std::chrono::steady_clock::now();
  r.grad_norm = clip_grad_norm(max_norm);
  r.norm_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // A non-finite norm means some gradient overflowed fp16's range: every rank sees the same norm (it
  // is reduced across shards), so every rank skips the same step.
  r.skipped = scaler_ && scaler_->update(!std::isfinite(r.grad_norm));
  const bool overlapping = overlap_ && !r.skipped;
  // Since the last report: the update's transfers (overlapped, the last step's) and, with the parameters
  // on NVMe, the reads of the step's forward and backward.
  const auto count_io = [&] {
    r.nvme_read = offload_read() - reported_read_;
    r.nvme_written = offload_written() - reported_written_;
    reported_read_ += r.nvme_read;
    reported_written_ += r.nvme_written;
  };
  if (overlapping) {
    count_io();   // before the update thread moves the file's counters again
    start_update(lr);   // beside the next forward; that step's report gives its time
    r.overlapped = true;
    r.update_s = r.norm_s + last_update_s_;
  } else {
    if (!r.skipped) step(lr);
    // On a GPU the update is queued, not done: wait for it, so update_ms is the update's time. The norm
    // has waited for the GPU already; this wait costs only the next batch's preparation overlapping the update.
    synchronize_device(store_.device());
    r.update_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    count_io();
  }
  if (metered()) {
    r.device_peak = device_peak_;
    r.evictions = evictions_;
    device_peak_ = evictions_ = 0;
  }
  if (overlapping) {   // the update thread zeroes each chunk's gradients once it has read them
    first_step_done_ = true;
    grad_scale_ = 1;
  } else {
    zero_grad();
  }
  return r;
}

std::string ZeroStrategy::overlap_blocker(const ZeroOptions& o) const {
  if (o.stage != 3) return "it needs zero = 3, where each block gathers its chunks as it runs (zero = " + std::to_string(o.stage) + ")";
  if (o.offload_params) return "with offload_params = \"nvme\" the forward reads the parameters from the file the update writes";
  if (tensor_group_ || pipeline_group_) return "under tensor or pipeline parallelism the update's norms are collectives the forward's would cross";
  if (group_.active() && !optimizer_->elementwise())
    return optimizer_->name() + "'s per-tensor norms are collectives across the shards, which the forward's would cross";
  if (metered() && store_.offloaded() && !store_.device().is_cpu())
    return "under a device budget the update's device copies of NVMe slices would fall in the forward's measured memory";
  return "";
}

void ZeroStrategy::start_update(double lr) {
  at::NoGradGuard no_grad;
  if (caching_) drop_cached();   // as in step()
  const optim::StepContext ctx = step_context(lr);
  optimizer_->begin_step();
  // More ranks: the chunks kept whole are updated here and their all-gathers launched, as step() does
  // (a collective belongs to this thread); the thread takes the rest, which the blocks gather themselves.
  std::vector<int64_t> here, beside;
  for (int64_t c : update_order_) (group_.active() && !store_.releasable(c) ? here : beside).push_back(c);
  const auto zero_grads = [this](int64_t c) { store_.grad_shards()[static_cast<size_t>(c)].zero_(); };
  update_chunks(ctx, here, zero_grads);
  publish_whole_chunks();
  overlapped_.start(store_.layout().chunks(), beside, store_.device(), update_threads_, [this, ctx, beside, zero_grads](const OverlappedUpdate::Done& done) {
    update_chunks(ctx, beside, [&](int64_t c) {
      zero_grads(c);
      done(c);
    });
  });
}

std::map<std::string, std::string> ZeroStrategy::scaler_state() const { return scaler_ ? scaler_->state() : std::map<std::string, std::string>{}; }

void ZeroStrategy::load_scaler_state(const std::map<std::string, std::string>& state, const std::string& where) {
  if (scaler_) scaler_->load_state(state, where);
}

double ZeroStrategy::clip_grad_norm(double max_norm) {
  finish_update();
  at::NoGradGuard no_grad;
  // Squares summed in double. On the host, the kernel's one read of each gradient shard, or for other
  // host layouts one slice of a chunk at a time: a norm asked for in double converts its whole input
  // first, a copy twice the size of the largest shard (the embedding's) at the step's peak; summed into
  // one value as they come, since results kept beside each slice's converted copy pinned glibc's heap,
  // which grew by every copy (a gigabyte at 150M parameters). On an accelerator, all of the device's
  // shards at once (sum_of_squares.h): slice by slice it was four launches a megabyte, 3 ms of them a
  // step for 100M parameters on an H100.
  constexpr int64_t kSlice = int64_t{1} << 20;
  // Compact gradient shards (compute dtype) are read as they are, with the factor they still owe.
  const auto& grads = store_.compact_grads() ? store_.grad_shards() : store_.master_grads();
  double host_sq = 0;
  at::Tensor slices_sq = at::zeros({}, at::kDouble);
  std::vector<at::Tensor> on_device;
  for (const auto& g : grads) {
    if (!g.defined() || g.numel() == 0) continue;
    if (!g.is_cpu()) {
      on_device.push_back(g);
    } else if (g.is_contiguous() && g.scalar_type() == at::kFloat) {
      host_sq += kernels::sum_squares(g.const_data_ptr<float>(), g.numel());
    } else if (g.is_contiguous() && g.scalar_type() == at::kDouble) {
      host_sq += kernels::sum_squares(g.const_data_ptr<double>(), g.numel());
    } else if (g.is_contiguous() && (g.scalar_type() == at::kBFloat16 || g.scalar_type() == at::kHalf)) {   // compact shards
      host_sq += kernels::sum_squares_half(static_cast<const uint16_t*>(g.const_data_ptr()), g.numel(),
                                           g.scalar_type() == at::kBFloat16 ? kernels::Half16::bf16 : kernels::Half16::fp16);
    } else {
      for (int64_t from = 0; from < g.numel(); from += kSlice)
        slices_sq.add_(at::linalg_vector_norm(g.narrow(0, from, std::min(kSlice, g.numel() - from)), 2, c10::nullopt, false, at::kDouble).square());
    }
  }
  at::Tensor sq = slices_sq.reshape({1}).add_(host_sq);
  if (!on_device.empty()) sq.add_(sum_of_squares(on_device).cpu());   // one transfer from the chunks' device
  // Tensor parallelism: a piece held by k ranks counts 1/k on each, and the group's sum counts it once.
  if (tensor_group_) sq.sub_(excess_squares(grads));
  for (int64_t slot : pipeline_copies_) {   // counted by the stage holding the original
    const auto part = store_.shard_part(slot);
    const at::Tensor& g = grads[static_cast<size_t>(store_.layout().slots[static_cast<size_t>(slot)].chunk)];
    if (!part || !g.defined()) continue;
    const double w = slot_weight_.empty() ? 1.0 : slot_weight_[static_cast<size_t>(slot)];
    sq.sub_(w * at::linalg_vector_norm(g.narrow(0, part->in_shard, part->numel), 2, c10::nullopt, false, at::kDouble).square().item<double>());
  }
  if (store_.stage() > 0) group_.all_reduce(sq, dist::Reduce::sum, "gradient norm");   // shards: sum over ranks
  if (tensor_group_) tensor_group_->all_reduce(sq, dist::Reduce::sum, "gradient norm");
  if (pipeline_group_) pipeline_group_->all_reduce(sq, dist::Reduce::sum, "gradient norm over the stages");
  // The gradients as the update will read them: a clipping scale not yet applied counts.
  const double norm = std::sqrt(sq.item<double>()) * grad_scale_ * std::abs(store_.grad_factor());
  if (max_norm > 0 && norm > max_norm && std::isfinite(norm)) {
    const double scale = max_norm / (norm + 1e-6);   // torch.nn.utils.clip_grad_norm_'s rule
    if (optimizer_->folds_grad_scale() && grad_scale_ == 1) {
      grad_scale_ = scale;   // the update applies it as it reads each gradient: no pass of its own
    } else {
      store_.scale_grads(scale * grad_scale_);
      grad_scale_ = 1;
    }
  }
  return norm;
}

double ZeroStrategy::excess_squares(const std::vector<at::Tensor>& grads) const {
  double sq = 0;
  for (const auto& [slot, weight] : held_by_several_) {
    const auto part = store_.shard_part(slot);
    if (!part) continue;
    const at::Tensor& g = grads[static_cast<size_t>(store_.layout().slots[static_cast<size_t>(slot)].chunk)];
    if (!g.defined()) continue;
    sq += (1.0 - weight) *
          at::linalg_vector_norm(g.narrow(0, part->in_shard, part->numel), 2, c10::nullopt, false, at::kDouble).square().item<double>();
  }
  return sq;
}

optim::StepContext ZeroStrategy::step_context(double lr) {
  optim::StepContext ctx;
  ctx.lr = lr;
  ctx.tensors = static_cast<int64_t>(store_.layout().slots.size());
  ctx.grad_scale = grad_scale_;   // clipping's, when the optimizer folds it into its pass
  grad_scale_ = 1;
  if (store_.compact_grads())   // the pieces read compact shards as they are: with this step's factor
    for (auto& piece : pieces_) piece.grad_factor = store_.grad_factor();
  const bool straddles = store_.stage() > 0 && group_.active();   // a tensor may straddle two ranks' shards
  if (straddles || tensor_group_)
    ctx.sum_across_shards = [this, straddles](at::Tensor& t) {
      if (straddles) group_.all_reduce(t, dist::Reduce::sum, "optimizer norms");
      if (!tensor_group_) return;
      // [quantities, tensors]: each tensor's pieces summed over the group, a piece held by k ranks 1/k each
      t.mul_(at::tensor(slot_weight_, at::kDouble).unsqueeze(0));
      tensor_group_->all_reduce(t, dist::Reduce::sum, "optimizer norms of split tensors");
    };
  return ctx;
}

void ZeroStrategy::step(double lr) {
  finish_update();
  at::NoGradGuard no_grad;
  // Gathered chunks kept between uses (placement auto) are copies of the shards the update is about to
  // change: they go now, and the blocks gather the updated values as they next run (across a step's
  // micro-batches the copies stay valid, and that is where keeping them pays).
  if (caching_) drop_cached();
  const optim::StepContext ctx = step_context(lr);
  if (store_.offloaded()) {
    optimizer_->begin_step();
    streamed_update(ctx, update_order_, [](int64_t) {});
  } else {
    optimizer_->step(pieces_, ctx);
  }
  store_.publish();
  publish_whole_chunks();
}

void ZeroStrategy::publish_whole_chunks() {
  if (store_.stage() == 0 || !group_.active()) return;
  // Every rank updated its shard; all-gather makes each chunk whole again on every rank. The gathers
  // run while the next forward starts: each chunk is waited for where it is first read.
  for (int64_t c = 0; c < store_.layout().chunks(); ++c) {
    if (store_.releasable(c)) continue;   // ZeRO-3: gathered when its block next runs
    const auto k = static_cast<size_t>(c);   // in place: this rank's shard is its part of the chunk
    publishing_[k] = group_.all_gather_async(store_.params()[k], store_.param_shard(c), "parameter chunk " + std::to_string(c));
  }
  if (!gather_hook_) wait_published();   // nothing tells this strategy when blocks run: wait now
}

at::Tensor ZeroStrategy::full_grad(const std::string& name) {
  finish_update();
  const auto slot = store_.slot_of(name);
  if (!slot || store_.stage() >= 2) throw Error("zero: no whole gradient of \"" + name + "\" at stage " + std::to_string(store_.stage()) + " (internal)");
  const auto& s = store_.layout().slots[static_cast<size_t>(*slot)];
  return store_.full_grads()[static_cast<size_t>(s.chunk)].narrow(0, s.offset, s.numel);
}

void ZeroStrategy::zero_grad() {
  finish_update();
  first_step_done_ = true;   // under a budget, the next block visit closes the first step's record and plans (auto)
  grad_scale_ = 1;   // a skipped step leaves clipping's scale unused
  if (store_.stage() <= 1)
    for (auto& g : store_.full_grads()) g.zero_();
  else
    for (auto& g : store_.grad_shards()) g.zero_();
}

void ZeroStrategy::for_each_owned(const OwnedFn& fn) {
  wait_published();   // the parameters are read whole below
  free_spares();
  const auto& layout = store_.layout();
  const auto names = optimizer_->state_names();
  const bool gather = store_.stage() > 0 && group_.active();
  // The one rank writing chunk c's tensors (a chunk holding one large tensor, such as the embedding),
  // or none when several do.
  auto sole_writer = [&](int64_t c) -> std::optional<int64_t> {
    const auto& slots = layout.chunk_slots[static_cast<size_t>(c)];
    const int64_t first = store_.owner(slots.front());
    for (int64_t i : slots)
      if (store_.owner(i) != first) return std::nullopt;
    return first;
  };
  // The whole chunk of one of this rank's shard tensors, gathered from every rank's shard: on its sole
  // writer only when it has one (undefined elsewhere), else on every rank.
  auto whole_of = [&](const at::Tensor& host_or_device, int64_t c, std::optional<int64_t> writer, const std::string& what) {
    if (!gather) return host_or_device;
    // A shard in host memory (placement) is gathered on the device: a collective works on one device.
    const at::Tensor shard = host_or_device.to(store_.device());
    const std::string purpose = what + " of chunk " + std::to_string(c);
    at::Tensor w = !writer || *writer == group_.rank() ? at::empty({layout.chunk_sizes[static_cast<size_t>(c)]}, shard.options()) : at::Tensor();
    if (writer) group_.gather(w, shard, *writer, purpose);
    else group_.all_gather(w, shard, purpose);
    return w;
  };
  for (int64_t c = 0; c < layout.chunks(); ++c) {
    const auto writer = sole_writer(c);
    std::vector<at::Tensor> whole;   // each state of the whole chunk
    const auto shards = store_.chunk_states(c, names);   // read from NVMe if offloaded
    for (size_t k = 0; k < names.size(); ++k) whole.push_back(whole_of(shards[k], c, writer, "optimizer state " + names[k]));
    // Mixed precision saves the master weights, the full-precision values.
    const bool from_master = store_.mixed() || store_.releasable(c);   // the parameters' own values are not whole here
    const at::Tensor master = from_master ? whole_of(store_.master_chunk(c), c, writer, "master weights") : at::Tensor();
    for (int64_t i : layout.chunk_slots[static_cast<size_t>(c)]) {
      if (store_.owner(i) != group_.rank()) continue;
      const auto& s = layout.slots[static_cast<size_t>(i)];
      // A view into the gathered chunk: the checkpoint writes it before the next chunk is gathered.
      auto piece = [&](const at::Tensor& w) { return w.narrow(0, s.offset, s.numel).view(s.shape); };
      std::vector<at::Tensor> states;
      for (const auto& w : whole) states.push_back(piece(w));
      fn(i, master.defined() ? piece(master) : store_.param_of(i).detach(), states);
    }
  }
}

void ZeroStrategy::load_state(int64_t slot, size_t k, const at::Tensor& full) {
  finish_update();
  const auto part = store_.shard_part(slot);
  if (!part) return;
  const int64_t chunk = store_.layout().slots[static_cast<size_t>(slot)].chunk;
  store_.write_state(chunk, optimizer_->state_names()[k], part->in_shard, full.reshape({-1}).narrow(0, part->in_tensor, part->numel));
}

}  // namespace colossal::memory
