// MemoryTracer: what a training step holds, event by event (`colossal profile`, and the measurements a
// placement policy plans from: Gemini's memory tracer).
//
// Every allocation ATen makes on the compute device (host memory, or the GPU's caching allocator) on the
// training thread is counted (AllocationCounter), so "live" is exact bytes of tensors, not the resident
// set with glibc's free lists in it, nor the GPU allocator's reserve. As a block hook, the
// tracer records before and after each block's forward
// and backward: the bytes live, the peak since the previous event, what the chunk store holds by kind,
// and where each chunk is; the training loop adds step-level marks (forward, backward, update). Events
// are kept only between begin() and end(), the traced steps; the counter runs from before the model
// exists, so memory allocated during warm-up is known when it is freed.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "src/memory/allocation_counter.h"
#include "src/memory/chunk_store.h"
#include "src/nn/block_hooks.h"

namespace colossal::memory {

class MemoryTracer : public nn::BlockHook {
 public:
  // `counter` counts on the thread that runs the steps, from before the model is built so the chunks
  // themselves are counted.
  explicit MemoryTracer(std::shared_ptr<AllocationCounter> counter) : counter_(std::move(counter)) {}

  // Where a chunk is at an event: whole on the compute device, only this rank's shard on the device
  // (ZeRO-3, released) or on the host (a placement's offload), or only in the offload file (parameters
  // on NVMe).
  enum class Tier : char { whole = 'w', shard = 's', host = 'h', nvme = 'n' };
  struct Event {
    std::string phase;     // forward | backward (a block's), or a step-level mark
    int64_t block = -1;    // -1: a step-level mark
    bool enter = true;     // a block's: before (true) or after its forward or backward
    double t_ms = 0;       // since begin()
    int64_t live = 0;      // ATen bytes live now
    int64_t peak = 0;      // the most live since the previous event
    ChunkBytes held;       // the chunk store's bytes now
    std::string tiers;     // one Tier per chunk
  };

  void attach(ChunkStore& store) { store_ = &store; }   // whose bytes and chunks events record
  void begin();                        // events from here (the traced steps)
  void end();                          // and no more
  void mark(const std::string& phase);   // a step-level event
  const std::vector<Event>& events() const { return events_; }
  int64_t live() const;                // ATen bytes live now (since construction)

  void before_forward(int64_t block) override { record("forward", block, true); }
  void after_forward(int64_t block) override { record("forward", block, false); }
  void before_backward(int64_t block) override { record("backward", block, true); }
  void after_backward(int64_t block) override { record("backward", block, false); }

 private:
  void record(const std::string& phase, int64_t block, bool enter);
  std::shared_ptr<AllocationCounter> counter_;
  ChunkStore* store_ = nullptr;
  bool tracing_ = false;
  double start_ = 0;
  std::vector<Event> events_;
};

}  // namespace colossal::memory
