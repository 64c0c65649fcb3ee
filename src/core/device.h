// Device and process facts: which compute device a recipe's `device` resolves to, and the process's
// resident memory and an accelerator's allocated memory (the figures in progress lines and summaries).
#pragma once
#include <c10/core/Device.h>
#include <cstddef>
#include <cstdint>
#include <string>

namespace colossal {

// "auto" -> CUDA when LibTorch has it and a GPU is visible, else CPU; "cuda" without one is an error
// naming `where` (the recipe key's location).
c10::Device resolve_device(const std::string& spec, const std::string& where);
std::string describe_device(const c10::Device& device);   // "cpu (2 threads)" or "cuda:0 (NVIDIA H100 ...)"
int64_t cuda_device_count();   // GPUs visible to this process (0 without CUDA)
// The device of local rank `local_rank` of `local_ranks` on this node, `resolved` from `spec`: on CUDA
// each rank its own GPU (NCCL runs one rank a GPU; two on one GPU fail at their first collective). With
// fewer GPUs visible than ranks, a set CUDA_VISIBLE_DEVICES is taken as the launcher's binding of each
// rank to its own GPUs; without one the ranks would share, so "auto" falls back to the CPU (the caller
// says so) and "cuda" is an error naming `where`, before any rank connects.
c10::Device device_for_rank(const c10::Device& resolved, const std::string& spec, int64_t local_rank, int64_t local_ranks,
                            const std::string& where);
// The same choice from the facts it reads: `gpus` visible to this process, and whether a launcher bound
// each rank to its own (CUDA_VISIBLE_DEVICES set).
c10::Device device_for_rank(const c10::Device& resolved, const std::string& spec, int64_t local_rank, int64_t local_ranks, int64_t gpus,
                            bool bound_by_launcher, const std::string& where);

// This machine's name as the system reports it ("unknown" if it cannot), for messages naming a node.
std::string host_name();

size_t current_rss_bytes();
size_t peak_rss_bytes();
// The machine's physical memory (what a CPU run can hold at most).
size_t physical_memory_bytes();
// What this process may hold: the physical memory, or less where its memory cgroup caps it (cgroup v2
// memory.max, v1 memory.limit_in_bytes, of its own cgroup and those above it), as a SLURM job's or a
// container's limit does.
size_t usable_memory_bytes();
// Throws when `bytes` (what `what` needs, estimated before allocating) exceed the physical memory:
// "<what> needs about 4.00 TiB but this machine has 23.4 GiB of memory".
void require_host_memory(double bytes, const std::string& what);
// Bytes held by tensors on an accelerator now and at their peak, from its caching allocator
// (0 for the CPU, whose figure is the RSS above).
size_t device_allocated_bytes(const c10::Device& device);
size_t device_peak_allocated_bytes(const c10::Device& device);
void reset_device_peak(const c10::Device& device);   // the peak restarts from what is allocated now
// Waits for the work queued on an accelerator (timing a region there); nothing on the CPU.
void synchronize_device(const c10::Device& device);
// An accelerator's total memory (the CPU's: the machine's physical memory).
size_t device_total_bytes(const c10::Device& device);

}  // namespace colossal
