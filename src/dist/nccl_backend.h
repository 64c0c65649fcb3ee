// NCCL process groups for CUDA tensors, compiled where the build has NCCL's header (CUDA builds);
// elsewhere make_nccl_backend says so. Internal to src/dist.
#pragma once
#include <chrono>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace colossal::dist {

bool nccl_available();
c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int64_t rank,
                                                    int64_t size, std::chrono::milliseconds timeout);

}  // namespace colossal::dist
