// Data parallelism: gradients averaged across the data-parallel group in buckets, each launched the
// moment its last gradient is ready so communication overlaps the rest of backward (DDP's design).
//
// Buckets are contiguous ranges of the flat gradient buffers themselves (DDP's gradient_as_bucket_view:
// no copy in or out), cut in reverse parameter order (the order backward produces them) at about
// `bucket_bytes`. Readiness comes from a post-hook on each parameter's gradient accumulator, which the
// autograd engine runs after everything feeding that gradient has finished, including layers that
// write their weight gradient straight into the buffer and hand autograd nothing (src/nn/gemm_choice.h).
// Buckets launch in the order they become ready: backward runs the same graph in the same order on
// every rank, so every rank launches the same sequence of collectives.
#pragma once
#include <ATen/core/Tensor.h>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "src/dist/group.h"

namespace colossal::parallel {

// One flat gradient buffer and the parameters whose `.grad` are views into it, in buffer order.
struct GradSlice {
  at::Tensor param;
  int64_t offset = 0, numel = 0;
};
struct GradBuffer {
  at::Tensor grads;   // 1-D, contiguous
  std::vector<GradSlice> slices;
};

class DataParallel {
 public:
  DataParallel(std::vector<GradBuffer> buffers, dist::Group& group, int64_t bucket_bytes);
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // Before each micro-batch's backward: `sync` = this is the step's last micro-batch, whose backward
  // reduces the accumulated gradients. Earlier micro-batches only accumulate locally.
  void prepare(bool sync);
  // After the synced backward: launches any bucket whose parameters got no gradient, waits for all and
  // leaves every rank with the average. A no-op after an unsynced backward.
  void finish();
  // Makes every rank start from rank 0's values (parameters built from the same seed agree already;
  // this guards against any difference in initialisation or loading).
  void broadcast_from_root(const std::vector<at::Tensor>& flat_params);

  int64_t bucket_count() const { return static_cast<int64_t>(buckets_.size()); }
  std::vector<std::pair<int64_t, int64_t>> bucket_ranges(int64_t buffer) const;   // (offset, numel), tests

 private:
  struct Bucket {
    int64_t buffer = 0, offset = 0, numel = 0;
    int64_t params = 0;     // gradients it waits for
    int64_t waiting = 0;    // still outstanding this backward
    dist::Pending pending;
    bool launched = false;
  };
  void ready(int64_t bucket);
  void launch(Bucket& b, int64_t index);

  std::vector<GradBuffer> buffers_;
  dist::Group& group_;
  std::vector<Bucket> buckets_;
  bool sync_ = false;
  struct Hooks;
  std::unique_ptr<Hooks> hooks_;
};

}  // namespace colossal::parallel
