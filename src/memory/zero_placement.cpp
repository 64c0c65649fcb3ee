// Gemini's placement on ZeRO-3's chunks (see PlacementOptions in zero_strategy.h): where each chunk's
// data lives, which gathered chunks stay on the device between uses, and the device budget.
//
// Measuring. Under a budget the step is cut into windows, one per block visit (a block's forward or
// backward), from the visit's start to the next one's; the gap after the last forward (the loss and its
// head) and the update belong to the window before them. The device's peak in each window is taken
// from the device's allocator (a GPU) or from ATen's bytes on the training thread less what the chunks
// keep on the host (a CPU, where the device is host memory). During the first step, which gathers
// each block's chunks as it runs and releases them after, what a window held beyond the chunks
// (activations, gradient chunks in flight, workspace) is recorded with the order of the visits.
//
// Planning (auto). The first step's peak beside the budget is what is spare; chunks move their data to
// the device while it fits, those whose data crosses the bus most per byte first (a chunk there is
// gathered without a transfer and updated by the device's optimizer). Whatever is left caches gathered
// chunks: they are no longer released after use, and before each visit the cached chunks the visit does
// not need are evicted, furthest next use first, until the visit's chunks, the next visit's (prefetched)
// and the window's measured extra fit.
//
// Enforcing. Every window's peak is checked against the budget at every placement; the first step
// runs with the fewest chunks the model can run with, so a budget it exceeds is too small for the
// model and batch, and the run ends saying what that window needed.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <algorithm>
#include <map>

#include "src/core/device.h"
#include "src/core/error.h"
#include "src/core/text.h"
#include "src/memory/zero_strategy.h"

namespace colossal::memory {

int64_t ZeroStrategy::take_device_peak() {
  if (!store_.device().is_cpu()) {
    const auto peak = static_cast<int64_t>(device_peak_allocated_bytes(store_.device()));
    reset_device_peak(store_.device());
    return peak;
  }
  // What the chunks keep on the host changes only between windows (placement decisions), not within one;
  // the staging buffers are not ATen's.
  const ChunkBytes b = store_.bytes();
  return placement_.counter->take_peak(AllocationCounter::placement) - (b.host - b.staging);
}

int64_t ZeroStrategy::chunk_device_bytes() const { return store_.bytes().device() + store_.spare_bytes(); }

void ZeroStrategy::check_budget(int64_t peak, const std::string& where) const {
  if (peak <= placement_.device_limit) return;
  const int64_t chunks = chunk_device_bytes();
  throw Error("device_memory_limit_gb: " + where + " held " + human_bytes(static_cast<double>(peak)) + " on " + store_.device().str() +
              ", over the budget of " + human_bytes(static_cast<double>(placement_.device_limit)) + " (the chunks " +
              human_bytes(static_cast<double>(chunks)) + ", activations and workspace the rest" +
              (caching_ ? "" : ", with each block's chunks gathered only while it runs") +
              "); raise device_memory_limit_gb, or lower train.batch_size or train.seq_len");
}

void ZeroStrategy::close_window() {
  if (!in_window_) {   // the first visit: what came before it (setup) is no window
    take_device_peak();
    return;
  }
  in_window_ = false;
  const int64_t peak = take_device_peak();
  device_peak_ = std::max(device_peak_, peak);
  device_peak_all_ = std::max(device_peak_all_, peak);
  check_budget(peak, "block " + std::to_string(window_block_) + "'s " + (window_direction_ > 0 ? "forward" : "backward") +
                         (recording_ ? " in the first step" : ""));
  if (window_recorded_) {   // the least the chunks held in the window: the rest of its peak was not theirs
    const int64_t extra = peak - std::min(window_chunks_, chunk_device_bytes());
    window_extra_.back() = std::max(window_extra_.back(), extra);
  }
}

void ZeroStrategy::placement_enter(int64_t block, int direction) {
  if (!metered()) return;
  close_window();
  if (recording_ && first_step_done_) plan_placement();   // that was the first step's last window
  window_block_ = block;
  window_direction_ = direction;
  // The first training step is recorded; an evaluation's forward (no gradients) is not part of the
  // sequence that repeats, though its windows are held to the budget too. (Autograd runs backward with
  // gradient mode off: a backward visit is always training's.)
  window_recorded_ = recording_ && (direction < 0 || at::GradMode::is_enabled());
  if (window_recorded_) {
    trace_.record(block, direction, block_chunks_[static_cast<size_t>(block)]);
    window_extra_.push_back(0);
  }
  if (recording_) return;
  if (auto v = trace_.find(block, direction, visit_)) visit_ = *v;
  if (caching_) make_room(visit_);
}

void ZeroStrategy::placement_entered() {
  if (!metered()) return;
  window_chunks_ = chunk_device_bytes();
  in_window_ = true;
}

int64_t ZeroStrategy::whole_bytes(int64_t c) const {
  return static_cast<int64_t>(store_.params()[static_cast<size_t>(c)].nbytes());   // its elements, whether gathered or not
}

std::vector<int64_t> ZeroStrategy::visit_chunks(size_t visit) const {
  std::vector<int64_t> out = trace_.visit(visit).chunks;
  for (int64_t c : trace_.visit((visit + 1) % trace_.size()).chunks)   // prefetched during this visit
    if (std::find(out.begin(), out.end(), c) == out.end()) out.push_back(c);
  return out;
}

void ZeroStrategy::make_room(size_t visit) {
  const std::vector<int64_t> needed = visit_chunks(visit);
  // What this visit and the next will gather, by size: a spare buffer of that size serves one, new
  // memory the rest. Spares nothing will take are freed first, and an evicted chunk's memory stays only
  // as a spare some gather here will take.
  std::map<size_t, size_t> wanted;
  for (int64_t c : needed)
    if (!store_.present(c)) ++wanted[static_cast<size_t>(whole_bytes(c))];
  store_.trim_spares(wanted);
  auto held = [&] {   // what the chunks will hold once those are gathered
    int64_t fresh = 0;
    for (const auto& [bytes, n] : wanted) fresh += static_cast<int64_t>(bytes * (n - std::min(n, store_.spares_of(bytes))));
    return chunk_device_bytes() + fresh;
  };
  const int64_t allowed = plan_limit_ - window_extra_[visit];
  if (held() <= allowed) return;
  std::vector<int64_t> cached;
  for (int64_t c = 0; c < store_.layout().chunks(); ++c)
    if (droppable(c) && std::find(needed.begin(), needed.end(), c) == needed.end()) cached.push_back(c);
  for (int64_t c : trace_.eviction_order(cached, visit)) {
    if (held() <= allowed) break;
    const auto bytes = static_cast<size_t>(whole_bytes(c));
    store_.release(c, store_.spares_of(bytes) < wanted[bytes]);
    ++evictions_;
    ++evictions_all_;
  }
}

bool ZeroStrategy::droppable(int64_t c) {
  const auto k = static_cast<size_t>(c);
  return store_.releasable(c) && store_.present(c) && refs_[k] == 0 && !fetching_[k] && all_held(c);
}

void ZeroStrategy::drop_cached() {
  for (int64_t c = 0; c < store_.layout().chunks(); ++c)
    if (droppable(c)) store_.release(c);
}

void ZeroStrategy::plan_placement() {
  finish_update();   // chunks' homes move below
  recording_ = false;
  trace_.close(store_.layout().chunks());
  if (trace_.size() == 0) throw Error("placement: the first step ran no block (internal)");
  visit_ = trace_.size() - 1;
  if (placement_.mode != PlacementMode::automatic) return;
  // The first step's peak, measured with the fewest chunks gathered, is what the model needs; the rest
  // of the budget is spare. Chunks' data moves to the device while it fits, then gathered chunks stay.
  // offload_params or offload_optimizer = "cpu" keep their side on the host. What moves is on the device
  // in every window from then on, so it must fit beside each visit's least: the window's measured extra,
  // the chunks that stay whole (and the data already on the device), and the visit's and the next
  // visit's gathered chunks. What is spare beyond that caches gathered chunks.
  const bool params = !placement_.keep_params_on_host, states = !placement_.keep_states_on_host;
  int64_t base = store_.bytes().device();
  for (int64_t c = 0; c < store_.layout().chunks(); ++c)
    if (store_.releasable(c) && store_.present(c)) base -= whole_bytes(c);
  int64_t spare = plan_limit_;
  for (size_t v = 0; v < trace_.size(); ++v) {
    int64_t visiting = 0;
    for (int64_t c : visit_chunks(v)) visiting += whole_bytes(c);
    spare = std::min(spare, plan_limit_ - window_extra_[v] - base - visiting);
  }
  // Per chunk, what moving its host data takes on the device and what it saves the bus each step:
  // parameters on the host cross at every visit that gathers them; an optimizer side on the host takes
  // the reduced gradient out and sends the updated shard back. The most saved per byte moves first.
  const int64_t chunks = store_.layout().chunks();
  std::vector<int64_t> saved(static_cast<size_t>(chunks)), moved(static_cast<size_t>(chunks));
  for (int64_t c = 0; c < chunks; ++c) {
    const auto k = static_cast<size_t>(c);
    const int64_t param_bytes = store_.host_param_bytes(c), state_bytes = store_.chunk_bytes(c).host - param_bytes;
    const int64_t shard_bytes = store_.shard_numel(c) * static_cast<int64_t>(store_.params()[k].element_size());
    moved[k] = (params ? param_bytes : 0) + (states ? state_bytes : 0);
    saved[k] = (params ? trace_.gathers_per_step(c) * param_bytes : 0) + (states && state_bytes > 0 ? 2 * shard_bytes : 0);
  }
  for (int64_t c : placement_order(saved, moved)) {
    const auto k = static_cast<size_t>(c);
    if (moved[k] == 0 || moved[k] > spare) continue;
    store_.set_homes(c, {params ? Residence::device : store_.param_home(c), states ? Residence::device : store_.state_home(c)});
    spare -= moved[k];
  }
  if (!store_.offloaded()) pieces_ = store_.pieces(optimizer_->state_names(), weight_decay_, optimizer_->reads_half_grads());   // the moved tensors' views
  caching_ = true;
}

}  // namespace colossal::memory
