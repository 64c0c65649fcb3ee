// Device resolution and memory figures: see device.h.
#include "src/core/device.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <ATen/Context.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/cuda.h>

#include "src/core/error.h"
#include "src/core/text.h"

namespace colossal {

c10::Device resolve_device(const std::string& spec, const std::string& where) {
  // "cpu" never asks CUDA: asking starts the driver, whose threads a caller may not want yet (a server
  // blocks its signals before any thread starts, and a thread started earlier would take SIGTERM).
  if (spec == "cpu") return c10::Device(c10::kCPU);
  const bool cuda = torch::cuda::is_available();
  if (spec == "cuda") {
    if (!cuda)
      throw RecipeError(where, std::string("device = \"cuda\" but ") +
                                   (at::hasCUDA() ? "no GPU is visible" : "this LibTorch was built without CUDA") +
                                   " (use \"cpu\" or \"auto\")");
    return c10::Device(c10::kCUDA, 0);
  }
  if (spec == "auto") return cuda ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);
  throw RecipeError(where, "device = \"" + spec + "\" is not one of auto | cpu | cuda");
}

std::string host_name() {
  char name[256] = {};
  return gethostname(name, sizeof name - 1) == 0 ? name : "unknown";
}

int64_t cuda_device_count() { return torch::cuda::is_available() ? static_cast<int64_t>(torch::cuda::device_count()) : 0; }

c10::Device device_for_rank(const c10::Device& resolved, const std::string& spec, int64_t local_rank, int64_t local_ranks, int64_t gpus,
                            bool bound_by_launcher, const std::string& where) {
  if (!resolved.is_cuda() || local_ranks <= 1) return resolved;
  if (local_ranks <= gpus) return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(local_rank));
  // A launcher that binds each rank to its own GPUs (SLURM's --gpus-per-task, a per-rank
  // CUDA_VISIBLE_DEVICES) shows each process fewer GPUs than the node has ranks: they are its own.
  if (bound_by_launcher && gpus > 0) return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(local_rank % gpus));
  if (spec == "auto") return c10::Device(c10::kCPU);
  throw RecipeError(where, fmt::format("device = \"{}\" with {} ranks on this node but {} GPU(s) visible: each rank needs a GPU of "
                                       "its own (launch at most {} a node, or use \"cpu\")",
                                       spec, local_ranks, gpus, gpus));
}

c10::Device device_for_rank(const c10::Device& resolved, const std::string& spec, int64_t local_rank, int64_t local_ranks,
                            const std::string& where) {
  if (!resolved.is_cuda() || local_ranks <= 1) return resolved;   // asks CUDA nothing
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  return device_for_rank(resolved, spec, local_rank, local_ranks, cuda_device_count(), visible != nullptr && *visible != '\0', where);
}

std::string describe_device(const c10::Device& device) {
  if (device.is_cpu()) return "cpu (" + std::to_string(at::get_num_threads()) + " threads)";
  return device.str();
}

size_t current_rss_bytes() {
  long pages = 0, resident = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return static_cast<size_t>(resident) * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

size_t physical_memory_bytes() {
  return static_cast<size_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

namespace {

// The number in `file` ("max", unreadable or absurd: none).
std::optional<size_t> limit_in(const std::string& file) {
  std::ifstream in(file);
  std::string word;
  if (!(in >> word) || word.empty() || !std::isdigit(static_cast<unsigned char>(word[0]))) return std::nullopt;
  try {
    return static_cast<size_t>(std::stoull(word));
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace

size_t usable_memory_bytes() {
  size_t usable = physical_memory_bytes();
  std::ifstream cgroups("/proc/self/cgroup");
  for (std::string line; std::getline(cgroups, line);) {
    // "0::/path" (v2), or "4:memory:/path" (v1, the memory controller, perhaps among others)
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = "," + line.substr(a + 1, b - a - 1) + ",";
    const bool v2 = controllers == ",,", v1 = controllers.find(",memory,") != std::string::npos;
    if (!v1 && !v2) continue;
    const std::string root = v2 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/memory", file = v2 ? "/memory.max" : "/memory.limit_in_bytes";
    // Its own cgroup and every one above it: the tightest limit holds.
    for (std::string path = line.substr(b + 1); !path.empty(); path = path.substr(0, path.find_last_of('/'))) {
      if (auto limit = limit_in(root + path + file)) usable = std::min(usable, *limit);
      if (path == "/") break;
    }
  }
  return usable;
}

void require_host_memory(double bytes, const std::string& what) {
  const double have = static_cast<double>(physical_memory_bytes());
  if (bytes > have)
    throw Error(what + " needs about " + human_bytes(bytes) + " but this machine has " + human_bytes(have) +
                " of memory (a smaller model, batch or sequence fits)");
}

size_t peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<size_t>(u.ru_maxrss) * 1024;
}

namespace {
c10::CachingDeviceAllocator::Stat allocated_stat(const c10::Device& device) {
  if (device.is_cpu()) return {};
  auto stats = c10::getDeviceAllocator(device.type())->getDeviceStats(device.index() < 0 ? 0 : device.index());
  return stats.allocated_bytes[static_cast<size_t>(c10::CachingDeviceAllocator::StatType::AGGREGATE)];
}
}  // namespace

size_t device_allocated_bytes(const c10::Device& device) { return static_cast<size_t>(allocated_stat(device).current); }
size_t device_peak_allocated_bytes(const c10::Device& device) { return static_cast<size_t>(allocated_stat(device).peak); }

void reset_device_peak(const c10::Device& device) {
  if (!device.is_cpu()) c10::getDeviceAllocator(device.type())->resetPeakStats(device.index() < 0 ? 0 : device.index());
}

void synchronize_device(const c10::Device& device) {
  if (!device.is_cpu()) c10::impl::getDeviceGuardImpl(device.type())->synchronizeDevice(device.has_index() ? device.index() : 0);
}

size_t device_total_bytes(const c10::Device& device) {
  if (device.is_cpu()) return physical_memory_bytes();
  return c10::getDeviceAllocator(device.type())->getMemoryInfo(device.index() < 0 ? 0 : device.index()).second;
}

}  // namespace colossal
