// SpareBuffers: buffers kept for reuse, a few of each size, instead of going back to malloc. Collective
// scratch, gathered chunks and gradient chunks are allocated and freed many times a step at a handful of
// sizes; freed to malloc they stay in glibc's heaps (per thread, fragmented), so a rank's resident memory
// grew by gigabytes over what it ever held at once. A spare of the right size is reused instead.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/core/TensorOptions.h>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

namespace colossal {

class SpareBuffers {
 public:
  // Keeps at most `keep_per_size` spare buffers of each size (the rest are freed when given back).
  explicit SpareBuffers(size_t keep_per_size) : keep_(keep_per_size) {}

  // A contiguous 1-D tensor of `numel` elements (uninitialised): a spare of that size, else a new one.
  at::Tensor take(int64_t numel, const at::TensorOptions& options);
  // The same, with `make` allocating a new one (memory of a kind at::empty does not give: page-locked).
  at::Tensor take(int64_t numel, const at::TensorOptions& options, const std::function<at::Tensor()>& make);
  // Gives `t` (a tensor `take` returned, or any whole 1-D buffer) back for a later take of its size.
  void give(at::Tensor t);
  size_t kept() const;   // spare buffers held now
  void clear();          // frees every spare (before a phase that needs none of them)

 private:
  using Key = std::tuple<int64_t, int, int, int>;   // numel, dtype, device type, device index
  static Key key_of(int64_t numel, const at::TensorOptions& options);
  size_t keep_;
  mutable std::mutex mu_;   // collectives are launched and finished on more than one thread
  std::map<Key, std::vector<at::Tensor>> spare_;
};

}  // namespace colossal
