// Host <-> GPU copies beside the compute stream, for Gemini's placement on a GPU: a block's parameter
// chunks come over from host memory while the block before it computes, and its reduced gradients go
// back while the blocks after it run backward, without the host thread waiting for the GPU.
//
// Each copy runs on one side stream after everything queued on the compute stream so far (so a buffer
// the compute stream is still reading is not overwritten, and a value it is still writing is not read
// early), and gives a ticket: the compute stream waits for it on the GPU before using the destination,
// or the host waits for it before reading a host destination. Host memory must be page-locked for the
// copy to be asynchronous at all (page_locked_empty). On a CPU device, or in a build without CUDA,
// active() is false and callers copy as before.
#pragma once
#include <ATen/core/Tensor.h>
#include <memory>

namespace colossal::memory {

class CopyTicket {
 public:
  bool pending() const { return event_ != nullptr; }

 private:
  friend class DeviceCopies;
  std::shared_ptr<void> event_;   // a cudaEvent_t recorded on the side stream after the copy
};

class DeviceCopies {
 public:
  explicit DeviceCopies(c10::Device compute);   // inactive unless `compute` is a GPU of a CUDA build
  ~DeviceCopies();
  bool active() const { return impl_ != nullptr; }

  // dst.copy_(src) on the copy stream once the compute stream's work queued so far is done; one side
  // is the GPU, the other page-locked host memory of the same size and dtype.
  CopyTicket copy(const at::Tensor& dst, const at::Tensor& src);
  void compute_waits(CopyTicket& t);   // the compute stream waits on the GPU; the host goes on
  void host_waits(CopyTicket& t);      // the host blocks until the copy is done

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// `numel` elements of `dtype` in host memory that the GPU copies asynchronously (page-locked, exactly
// this size: ATen's pinned allocator rounds up to a power of two, up to twice the host memory for a
// model's shards). Plain host memory where the build has no CUDA or pinning fails: copies from it are
// then synchronous, and still correct.
at::Tensor page_locked_empty(int64_t numel, at::ScalarType dtype);

}  // namespace colossal::memory
