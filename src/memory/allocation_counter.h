// AllocationCounter: the bytes of tensors ATen holds on one device (the host, or the GPU a run computes
// on, whose caching allocator reports through the same hook), allocated on one thread (the training
// thread), counted exactly through c10's memory-reporting hook (the one torch.profiler's profile_memory
// uses: c10::MemoryReportingInfoBase, set for the thread as its PROFILER_STATE debug info). Exact bytes of
// tensors, not the resident set with glibc's free lists in it.
//
// Its users share one counter, since a thread has one such hook: `colossal profile`'s tracer, the
// trainer's per-step tensor peak (metrics' tensor_peak_mb), and on a CPU the placement's device meter
// (on a CPU the compute device is host memory, and a device budget is enforced against what ATen holds
// there).
//
// Allocations made on other threads (the data loader's batches) are not counted, and neither are their
// frees here; c10 would warn about the latter, so its glog-style warnings are raised to errors while a
// counter exists (ATen's TORCH_WARN goes another way and still shows).
#pragma once
#include <c10/core/Device.h>
#include <cstdint>
#include <memory>

namespace colossal::memory {

class AllocationCounter {
 public:
  // Counting `device`'s allocations starts on the calling thread.
  explicit AllocationCounter(c10::Device device = c10::Device(c10::kCPU));
  ~AllocationCounter();   // and stops (on the same thread)
  AllocationCounter(const AllocationCounter&) = delete;
  AllocationCounter& operator=(const AllocationCounter&) = delete;

  // Each reader keeps its own peak intervals, so the profiler's events and the placement's windows
  // do not cut each other's short.
  enum Reader { profile = 0, placement = 1, step = 2, kReaders = 3 };   // step: the trainer's per-step metric
  int64_t live() const;                // bytes held now
  int64_t peak(Reader r) const;        // the most held since r's last take_peak (or construction)
  int64_t take_peak(Reader r);         // peak(r), and a new interval for r starting from live()

 private:
  struct Reporter;
  std::shared_ptr<Reporter> reporter_;
  struct Guard;
  std::unique_ptr<Guard> guard_;
};

}  // namespace colossal::memory
