// Memory tracer: see memory_tracer.h.
#include "src/memory/memory_tracer.h"

#include <c10/core/Allocator.h>
#include <c10/util/Logging.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <algorithm>
#include <atomic>
#include <chrono>

namespace colossal::memory {

// Receives c10's report of every allocation (positive size) and free (negative) made on the thread.
struct MemoryTracer::Counter : public c10::MemoryReportingInfoBase {
  std::atomic<int64_t> live{0}, peak{0};
  void reportMemoryUsage(void*, int64_t size, size_t, size_t, c10::Device device) override {
    if (!device.is_cpu()) return;   // a device's own allocator reports separately: host memory only here
    const int64_t now = live.fetch_add(size) + size;
    int64_t seen = peak.load();
    while (now > seen && !peak.compare_exchange_weak(seen, now)) {
    }
  }
  bool memoryProfilingEnabled() const override { return true; }
};

// While counting, c10's glog-style warnings are raised to errors: its CPU allocator warns, once per
// thousand, on freeing memory it saw no allocation of, which is every tensor made on another thread
// (the data loader's batches) and freed on this one; those frees are simply not counted, as their
// allocations were not. ATen's own warnings (TORCH_WARN) go another way and still show.
struct MemoryTracer::Guard {
  explicit Guard(std::shared_ptr<c10::DebugInfoBase> info)
      : guard(c10::DebugInfoKind::PROFILER_STATE, std::move(info)), log_level(FLAGS_caffe2_log_level) {
    FLAGS_caffe2_log_level = std::max(FLAGS_caffe2_log_level, 2);   // 2: ERROR
  }
  ~Guard() { FLAGS_caffe2_log_level = log_level; }
  c10::DebugInfoGuard guard;
  int log_level;
};

namespace {

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

MemoryTracer::MemoryTracer() : counter_(std::make_shared<Counter>()), guard_(std::make_unique<Guard>(counter_)) {}

MemoryTracer::~MemoryTracer() = default;

int64_t MemoryTracer::live() const { return counter_->live.load(); }

void MemoryTracer::begin() {
  events_.clear();
  tracing_ = true;
  start_ = now_ms();
  counter_->peak.store(counter_->live.load());
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
  e.live = counter_->live.load();
  e.peak = std::max(counter_->peak.exchange(e.live), e.live);   // and the next interval starts from now
  e.held = store_->bytes();
  for (int64_t c = 0; c < store_->layout().chunks(); ++c)
    e.tiers.push_back(static_cast<char>(store_->present(c)         ? Tier::whole
                                        : store_->params_on_disk(c) ? Tier::nvme
                                                                    : Tier::shard));
  events_.push_back(std::move(e));
}

}  // namespace colossal::memory
