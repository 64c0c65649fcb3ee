// Kernel choice by first-use timing: see kernel_choice.h.
#include "src/nn/kernel_choice.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <spdlog/spdlog.h>
#include <stdexcept>
#include <string>

namespace colossal::nn {
namespace {

std::mutex g_mutex;
KernelPolicy g_policy;
std::map<std::string, bool> g_choices;   // "kernel shape" -> ours
std::atomic<uint64_t> g_epoch{0};   // kernel_choice_epoch()
constexpr int kTimedRounds = 5;           // timed calls per side after the warm-ups; the fastest counts
// Best times this close (the slower over the faster) are a near tie: kExtraRounds more alternating calls
// each, so that one noisy sample does not decide it.
constexpr double kNearTie = 1.10;
constexpr int kExtraRounds = 10;
// ATen is taken only when its best is faster than ours by more than this: within it our kernel is kept,
// whose results do not depend on the batch or the thread count, and near-equal kernels do not flip from
// run to run with the noise of a shared machine (±5-10% between first uses on a 2-core AMD EPYC, where
// GEMM shapes timed within a few percent of MKL took ours in one run and MKL's in the next).
constexpr double kTieMargin = 1.03;

double seconds_of(const std::function<void()>& f) {
  const auto start = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

KernelPath parse_kernel_path(const std::string& name) {
  if (name == "auto") return KernelPath::Auto;
  if (name == "fused") return KernelPath::Ours;
  if (name == "aten") return KernelPath::Aten;
  throw std::invalid_argument("\"" + name + "\" is not a kernel choice (valid: auto, fused, aten)");
}

const char* kernel_path_name(KernelPath path) {
  switch (path) {
    case KernelPath::Auto: return "auto";
    case KernelPath::Ours: return "fused";
    case KernelPath::Aten: return "aten";
  }
  return "?";
}

void set_kernel_policy(const KernelPolicy& policy) {
  std::lock_guard lock(g_mutex);
  g_policy = policy;
  g_choices.clear();
  g_epoch.fetch_add(1);
}

uint64_t kernel_choice_epoch() { return g_epoch.load(); }

KernelPolicy kernel_policy() {
  std::lock_guard lock(g_mutex);
  return g_policy;
}

std::optional<bool> decided_ours(const std::string& kernel, KernelPath forced, const std::string& shape) {
  if (forced != KernelPath::Auto) return forced == KernelPath::Ours;
  std::lock_guard lock(g_mutex);
  if (auto it = g_choices.find(kernel + " " + shape); it != g_choices.end()) return it->second;
  return std::nullopt;
}

bool use_ours(const std::string& kernel, KernelPath forced, const std::string& shape, const std::function<void()>& ours,
              const std::function<void()>& aten, const std::function<void()>& before_each) {
  if (auto d = decided_ours(kernel, forced, shape)) return *d;
  return time_and_choose(kernel, shape, ours, aten, before_each);
}

bool time_and_choose(const std::string& kernel, const std::string& shape, const std::function<void()>& ours,
                     const std::function<void()>& aten, const std::function<void()>& before_each) {
  const auto prepare = [&] {
    if (before_each) before_each();
  };
  // Two warm-ups each: first-touch allocations, caches, the thread pool, and glibc's mmap threshold,
  // which rises only once a large block has been freed (until then every large buffer is a fresh
  // mmap that the kernel zero-fills page by page, which a side allocating one more buffer pays more;
  // training fixes the threshold from the start, src/memory/host_heap.h, but infer and serve do not).
  for (int warm = 0; warm < 2; ++warm) {
    prepare();
    ours();
    prepare();
    aten();
  }
  double t_ours = 1e300, t_aten = 1e300;
  auto rounds = [&](int n) {
    for (int round = 0; round < n; ++round) {   // alternating, so drift on a shared machine hits both
      prepare();
      t_ours = std::min(t_ours, seconds_of(ours));
      prepare();
      t_aten = std::min(t_aten, seconds_of(aten));
    }
  };
  rounds(kTimedRounds);
  const bool near_tie = std::max(t_ours, t_aten) <= kNearTie * std::min(t_ours, t_aten);
  if (near_tie) rounds(kExtraRounds);
  const bool win = t_ours <= kTieMargin * t_aten;
  spdlog::info("kernels: {} [{}]: fused {:.3f} ms, ATen {:.3f} ms{} -> {}", kernel, shape, t_ours * 1e3, t_aten * 1e3,
               near_tie ? " (near tie: " + std::to_string(kTimedRounds + kExtraRounds) + " rounds)" : std::string(),
               win && t_ours > t_aten ? fmt::format("fused (within {:.0f}%)", (kTieMargin - 1) * 100) : win ? "fused" : "aten");
  std::lock_guard lock(g_mutex);
  g_choices.emplace(kernel + " " + shape, win);
  return win;
}

std::map<std::string, std::string> kernel_choices() {
  std::lock_guard lock(g_mutex);
  std::map<std::string, std::string> out;
  for (const auto& [k, ours] : g_choices) out[k] = ours ? "fused" : "aten";
  return out;
}

void restore_kernel_choices(const std::map<std::string, std::string>& choices) {
  std::lock_guard lock(g_mutex);
  for (const auto& [k, v] : choices) {
    if (v != "fused" && v != "aten")
      throw std::invalid_argument("kernel choice \"" + k + "\" = \"" + v + "\" (valid: fused, aten)");
    g_choices[k] = v == "fused";
  }
  g_epoch.fetch_add(1);
}

}  // namespace colossal::nn
