#include "src/memory/device_copies.h"

#include <ATen/ATen.h>
#include <cstdlib>

#include "kernels/cuda/built.h"
#include "src/core/error.h"
#if COLOSSAL_CUDA_KERNELS
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace colossal::memory {

#if COLOSSAL_CUDA_KERNELS
namespace {

cudaEvent_t event_of(const std::shared_ptr<void>& e) { return static_cast<cudaEvent_t>(e.get()); }

// An event recorded on `stream` now, destroyed with its last ticket.
std::shared_ptr<void> record_on(const c10::cuda::CUDAStream& stream) {
  cudaEvent_t e = nullptr;
  C10_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  std::shared_ptr<void> owned(e, [](void* p) { (void)cudaEventDestroy(static_cast<cudaEvent_t>(p)); });
  C10_CUDA_CHECK(cudaEventRecord(e, stream.stream()));
  return owned;
}

}  // namespace

struct DeviceCopies::Impl {
  c10::DeviceIndex device;
  c10::cuda::CUDAStream side;
};

DeviceCopies::DeviceCopies(c10::Device compute) {
  if (!compute.is_cuda()) return;
  const c10::DeviceIndex index = compute.has_index() ? compute.index() : 0;
  impl_ = std::make_unique<Impl>(Impl{index, c10::cuda::getStreamFromPool(/*isHighPriority=*/false, index)});
}

CopyTicket DeviceCopies::copy(const at::Tensor& dst, const at::Tensor& src) {
  if (dst.numel() != src.numel() || dst.scalar_type() != src.scalar_type() || !dst.is_contiguous() || !src.is_contiguous())
    throw Error("device copies: " + c10::str(src.sizes()) + " " + c10::toString(src.scalar_type()) + " into " + c10::str(dst.sizes()) +
                " " + c10::toString(dst.scalar_type()) + " (internal: one size and dtype, contiguous)");
  const c10::cuda::CUDAGuard on_device(impl_->device);
  // The compute stream's queued work first: it may still read dst (a spare buffer's last chunk) or
  // write src (a gradient being reduced).
  const std::shared_ptr<void> queued = record_on(c10::cuda::getCurrentCUDAStream(impl_->device));
  C10_CUDA_CHECK(cudaStreamWaitEvent(impl_->side.stream(), event_of(queued), 0));
  {
    const c10::cuda::CUDAStreamGuard on_side(impl_->side);
    dst.copy_(src, /*non_blocking=*/true);
  }
  CopyTicket t;
  t.event_ = record_on(impl_->side);
  return t;
}

void DeviceCopies::compute_waits(CopyTicket& t) {
  if (!t.pending()) return;
  C10_CUDA_CHECK(cudaStreamWaitEvent(c10::cuda::getCurrentCUDAStream(impl_->device).stream(), event_of(t.event_), 0));
  t.event_.reset();
}

void DeviceCopies::host_waits(CopyTicket& t) {
  if (!t.pending()) return;
  C10_CUDA_CHECK(cudaEventSynchronize(event_of(t.event_)));
  t.event_.reset();
}

at::Tensor page_locked_empty(int64_t numel, at::ScalarType dtype) {
  // Whole pages of its own: the driver pins pages, and a page shared with another allocation could be
  // registered twice.
  constexpr size_t kPage = 4096;
  const size_t bytes = (static_cast<size_t>(numel) * c10::elementSize(dtype) + kPage - 1) / kPage * kPage;
  void* p = nullptr;
  if (bytes > 0 && posix_memalign(&p, kPage, bytes) == 0) {
    if (cudaHostRegister(p, bytes, cudaHostRegisterDefault) == cudaSuccess)
      return at::from_blob(
          p, {numel},
          [](void* q) {
            (void)cudaHostUnregister(q);
            std::free(q);
          },
          at::TensorOptions().dtype(dtype));
    (void)cudaGetLastError();   // pinning refused (a locked-memory limit): plain memory, synchronous copies
    std::free(p);
  }
  return at::empty({numel}, at::TensorOptions().dtype(dtype));
}

#else  // no CUDA in this build: never active

struct DeviceCopies::Impl {};
DeviceCopies::DeviceCopies(c10::Device) {}
CopyTicket DeviceCopies::copy(const at::Tensor&, const at::Tensor&) { throw Error("device copies: no CUDA in this build (internal)"); }
void DeviceCopies::compute_waits(CopyTicket&) {}
void DeviceCopies::host_waits(CopyTicket&) {}
at::Tensor page_locked_empty(int64_t numel, at::ScalarType dtype) { return at::empty({numel}, at::TensorOptions().dtype(dtype)); }

#endif

DeviceCopies::~DeviceCopies() = default;

}  // namespace colossal::memory
