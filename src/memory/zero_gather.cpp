// Where the parameters are whole under ZeRO 1-3: see zero_strategy.h. ZeRO-3 gathers a block's chunks
// around its forward and its backward (the next block's prefetched) and releases them; at every stage
// from 1, the all-gather of updated parameters after a step is waited for where each chunk is first read.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <algorithm>

#include "src/memory/zero_strategy.h"

namespace colossal::memory {

void ZeroStrategy::fetch(int64_t c) {
  const auto k = static_cast<size_t>(c);
  if (store_.present(c) || fetching_[k]) return;
  // Updated beside this forward and not yet done: no prefetch, ensure waits for it and gathers then.
  if (!overlapped_.done(c)) return;
  fetching_[k] = true;
  if (store_.params_on_disk(c)) {   // the master's segment only, not the states beside it
    if (disk_fetches_.empty()) disk_fetches_.resize(static_cast<size_t>(store_.layout().chunks()));
    OffloadedStates& file = *store_.offloaded();
    const int64_t bytes = file.segment_read_bytes(c);
    auto& spare = read_buffers_[bytes];
    DiskFetch& f = disk_fetches_[k];
    if (spare.empty()) {
      f.buffer = AlignedBuffer(bytes);
    } else {
      f.buffer = std::move(spare.back());
      spare.pop_back();
    }
    f.read = file.read_segment(c, store_.master_segment(), f.buffer);
    return;
  }
  const at::Tensor& whole = store_.materialize(c);
  // One rank on a GPU with its shard in host memory (placement): the shard is the whole chunk, copied
  // over on the side stream while the running block computes.
  if (copies_.active() && group_.size() == 1 && store_.param_home(c) == Residence::host) {
    param_copies_[k] = copies_.copy(whole, store_.param_shard(c));
    return;
  }
  // A shard in host memory (placement) is brought to the device first: a collective works on one device.
  fetches_[k] = group_.all_gather_async(whole, store_.param_shard(c).to(whole.device()), "gathering parameter chunk " + std::to_string(c));
}

void ZeroStrategy::ensure(int64_t c) {
  overlapped_.wait(c);
  const auto k = static_cast<size_t>(c);
  if (!fetching_[k] && store_.present(c)) return;
  fetch(c);
  if (store_.params_on_disk(c))
    finish_disk_fetch(c);
  else if (param_copies_[k].pending())
    copies_.compute_waits(param_copies_[k]);   // on the GPU: the host goes on launching this block
  else
    group_.wait(fetches_[k]);
  fetching_[k] = false;
  store_.gathered(c);
}

void ZeroStrategy::finish_disk_fetch(int64_t c) {
  at::NoGradGuard no_grad;
  DiskFetch& f = disk_fetches_[static_cast<size_t>(c)];
  store_.offloaded()->wait(f.read);
  const at::Tensor& whole = store_.materialize(c);
  // One rank reads its shard, the whole chunk, straight into place; more cast theirs into a shard to
  // all-gather (the read overlapped compute; the gather, ZeRO-3's usual cost, follows it).
  const at::Tensor shard = group_.size() == 1 ? whole.narrow(0, store_.shard_begin(c), store_.shard_numel(c))
                                              : at::empty({store_.shard_numel(c)}, whole.options());
  for (const auto& [begin, values] : f.read.pieces) shard.narrow(0, begin, values.numel()).copy_(values);   // to the compute dtype
  f.read.pieces.clear();
  group_.all_gather(whole, shard, "gathering parameter chunk " + std::to_string(c));
  auto& spare = read_buffers_[f.buffer.size()];
  if (spare.size() < 4) spare.push_back(std::move(f.buffer));
  f.buffer = AlignedBuffer();
}

bool ZeroStrategy::all_held(int64_t c) {
  for (int64_t i : store_.layout().chunk_slots[static_cast<size_t>(c)])
    if (store_.tensor_state(i) != TensorState::hold) return false;
  return true;
}

void ZeroStrategy::maybe_release(int64_t c) {
  if (caching_) return;   // gathered chunks stay until the placement evicts them (make_room)
  if (!droppable(c)) return;
  if (std::find(upcoming_.begin(), upcoming_.end(), c) != upcoming_.end()) return;   // the next block needs it
  store_.release(c);
}

void ZeroStrategy::enter_block(int64_t b, int direction) {
  if (direction < 0) finish_update();   // backward writes gradients the update reads and then zeroes
  placement_enter(b, direction);   // a device budget: the last window closes, room is made for this one
  for (int64_t c : block_whole_chunks_[static_cast<size_t>(b)]) wait_published(c);
  if (direction < 0 && store_.stage() >= 2) {   // the block's gradients are summed where they are computed
    for (int64_t c : block_chunks_[static_cast<size_t>(b)]) sum_in_place(c);
    for (int64_t c : block_whole_chunks_[static_cast<size_t>(b)]) sum_in_place(c);
  }
  if (store_.stage() < 3) return;
  if (direction < 0) launched_before_block_ = launched_;
  for (int64_t c : block_chunks_[static_cast<size_t>(b)]) {
    ensure(c);
    ++refs_[static_cast<size_t>(c)];
  }
  for (int64_t i : block_slots_[static_cast<size_t>(b)]) store_.set_state(i, TensorState::compute);
  // Prefetch: the next block's chunks (the following one in forward, the preceding one in backward)
  // are gathered while this block computes.
  const int64_t next = b + direction;
  upcoming_.clear();
  if (next >= 0 && next < static_cast<int64_t>(block_chunks_.size())) {
    upcoming_ = block_chunks_[static_cast<size_t>(next)];
    for (int64_t c : upcoming_) fetch(c);
  }
  placement_entered();
}

void ZeroStrategy::leave_block(int64_t b, int direction) {
  if (store_.stage() < 3) return;
  // The reductions launched before this block's backward have overlapped it: completed now, so their
  // chunks' parameters are released one block after their last use instead of piling up behind the
  // in-flight window (with blocks spanning chunks, that kept most of the model gathered in backward).
  if (direction < 0) complete_until(static_cast<size_t>(std::max<int64_t>(0, launched_ - launched_before_block_)));
  // After forward the tensors are held again; after backward they wait for their gradients (unless a
  // gradient was already final and reduced).
  for (int64_t i : block_slots_[static_cast<size_t>(b)])
    if (store_.tensor_state(i) == TensorState::compute) store_.set_state(i, direction > 0 ? TensorState::hold : TensorState::hold_after_bwd);
  for (int64_t c : block_chunks_[static_cast<size_t>(b)]) {
    --refs_[static_cast<size_t>(c)];
    maybe_release(c);
  }
  // The first block's backward is the step's last gather: the spares would sit idle through the
  // embedding's backward, the last reductions and the update.
  if (direction < 0 && b == 0) free_spares();
}

void ZeroStrategy::gather_all() {
  wait_published();
  if (store_.stage() < 3) return;
  for (int64_t c = 0; c < store_.layout().chunks(); ++c)
    if (store_.releasable(c)) ensure(c);
}

void ZeroStrategy::settle_chunks() {
  if (store_.stage() < 3) return;
  // After a backward (or an eval forward): nothing is upcoming; prefetches are finished and every
  // block chunk goes back to its shard.
  upcoming_.clear();
  for (int64_t c = 0; c < store_.layout().chunks(); ++c) {
    if (!store_.releasable(c)) continue;
    if (fetching_[static_cast<size_t>(c)]) ensure(c);
    for (int64_t i : store_.layout().chunk_slots[static_cast<size_t>(c)]) {
      if (store_.tensor_state(i) != TensorState::hold_after_bwd) continue;   // no gradient came (unused in this loss)
      store_.set_state(i, TensorState::ready_for_reduce);
      store_.set_state(i, TensorState::hold);
    }
    maybe_release(c);
  }
}

void ZeroStrategy::wait_published(int64_t c) {
  overlapped_.wait(c);
  const auto k = static_cast<size_t>(c);
  if (publishing_[k].active()) group_.wait(publishing_[k]);
}

void ZeroStrategy::wait_published() {
  finish_update();
  for (int64_t c = 0; c < store_.layout().chunks(); ++c) wait_published(c);
}

void ZeroStrategy::before_forward() {
  if (!counting_io_) {   // step reports count the disk's bytes from the first forward, not the loading before it
    counting_io_ = true;
    reported_read_ = offload_read();
    reported_written_ = offload_written();
  }
  for (int64_t c : outer_chunks_) wait_published(c);
}

}  // namespace colossal::memory
