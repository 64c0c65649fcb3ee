// Allocation counter: see allocation_counter.h.
#include "src/memory/allocation_counter.h"

#include <c10/core/Allocator.h>
#include <c10/util/Logging.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <algorithm>
#include <atomic>

namespace colossal::memory {

// Receives c10's report of every allocation (positive size) and free (negative) made on the thread.
struct AllocationCounter::Reporter : public c10::MemoryReportingInfoBase {
  explicit Reporter(c10::Device d) : counted(d) {}
  const c10::Device counted;
  std::atomic<int64_t> live{0};
  std::atomic<int64_t> peak[kReaders] = {};
  void reportMemoryUsage(void*, int64_t size, size_t, size_t, c10::Device device) override {
    if (device.type() != counted.type() || (counted.has_index() && device.index() != counted.index())) return;   // one device's
    const int64_t now = live.fetch_add(size) + size;
    for (auto& p : peak) {
      int64_t seen = p.load();
      while (now > seen && !p.compare_exchange_weak(seen, now)) {
      }
    }
  }
  bool memoryProfilingEnabled() const override { return true; }
};

struct AllocationCounter::Guard {
  explicit Guard(std::shared_ptr<c10::DebugInfoBase> info)
      : guard(c10::DebugInfoKind::PROFILER_STATE, std::move(info)), log_level(FLAGS_caffe2_log_level) {
    FLAGS_caffe2_log_level = std::max(FLAGS_caffe2_log_level, 2);   // 2: ERROR (see the header)
  }
  ~Guard() { FLAGS_caffe2_log_level = log_level; }
  c10::DebugInfoGuard guard;
  int log_level;
};

AllocationCounter::AllocationCounter(c10::Device device)
    : reporter_(std::make_shared<Reporter>(device)), guard_(std::make_unique<Guard>(reporter_)) {}

AllocationCounter::~AllocationCounter() = default;

int64_t AllocationCounter::live() const { return reporter_->live.load(); }

int64_t AllocationCounter::peak(Reader r) const { return std::max(reporter_->peak[r].load(), reporter_->live.load()); }

int64_t AllocationCounter::take_peak(Reader r) {
  const int64_t now = reporter_->live.load();
  return std::max(reporter_->peak[r].exchange(now), now);
}

}  // namespace colossal::memory
