// Memory tracer: see memory_tracer.h.
#include "src/memory/memory_tracer.h"

#include <algorithm>
#include <chrono>

namespace colossal::memory {

namespace {

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

int64_t MemoryTracer::live() const { return counter_->live(); }

void MemoryTracer::begin() {
  events_.clear();
  tracing_ = true;
  start_ = now_ms();
  counter_->take_peak(AllocationCounter::profile);
}

void MemoryTracer::end() { tracing_ = false; }

void MemoryTracer::mark(const std::string& phase) { record(phase, -1, true); }

void MemoryTracer::record(const std::string& phase, int64_t block, bool enter) {
  if (!tracing_ || !store_) return;
  Event e;
  e.phase = phase;
  e.block = block;
  e.enter = enter;
  e.t_ms = now_ms() - start_;
  e.live = counter_->live();
  e.peak = counter_->take_peak(AllocationCounter::profile);   // and the next interval starts from now
  e.held = store_->bytes();
  for (int64_t c = 0; c < store_->layout().chunks(); ++c)
    e.tiers.push_back(static_cast<char>(store_->present(c)                     ? Tier::whole
                                        : store_->params_on_disk(c)             ? Tier::nvme
                                        : store_->param_home(c) == Residence::host ? Tier::host
                                                                                : Tier::shard));
  events_.push_back(std::move(e));
}

}  // namespace colossal::memory
