// Timed kernel choices kept between processes, as cuDNN's and Triton's autotuning caches keep theirs.
// `colossal train`, `finetune`, `infer` and `serve` time our kernels against ATen's at each new shape
// (kernel_choice.h). Without this cache every run pays that timing again (14 of the 34 s of a 124M
// training run's first step on a 2-core Xeon) and draws its choices afresh from the machine's noise;
// a one-shot infer would pay more timing its prefill than it saves, and so keeps ATen's GEMM for it
// untimed (on an EPYC our GEMM prefills a 380-token prompt in about half ATen's time). With the cache
// the first run on a machine times and records its choices, and later runs start with them: no
// timing, the faster side from the first call on, and the same kernels from run to run.
//
// The file is JSON, one entry per key: the CPU model (its name, family and model numbers), the kernel
// set in use, any caps on ATen's instruction sets, the thread count, the LibTorch version and this
// binary (its size and modification time, so a rebuilt binary times afresh). Only this process's key
// is read; other keys are kept when it is written. A missing or unreadable file is no choices (a
// warning says why); writes go through a temporary file and a rename, so a crash or a second process
// writing at once leaves one whole version. Where:
//   $COLOSSAL_KERNEL_CACHE      that file ("off": no cache; tests run with it off)
//   $XDG_CACHE_HOME/colossal/kernel-choices.json, else ~/.cache/colossal/kernel-choices.json
#pragma once
#include <cstddef>
#include <optional>
#include <string>

namespace colossal {

// The file this process uses, or nullopt when the cache is off or no home directory is known.
std::optional<std::string> kernel_cache_path();

// What the choices depend on, as the entry's name.
std::string kernel_cache_key();

// Loads `key`'s choices from `file` into the kernel-choice table (call after set_kernel_policy, which
// clears it) and returns how many; a missing file gives 0, an unreadable one 0 and a warning.
size_t load_kernel_cache(const std::string& file, const std::string& key);

// Writes the table's choices under `key` into `file`, keeping the other keys (at most kKeptKeys, the
// most recently written); nothing when the table holds nothing new. Failures are warnings: the
// choices are an optimisation, never a reason to fail a run.
constexpr size_t kKeptKeys = 16;
void save_kernel_cache(const std::string& file, const std::string& key);

// Both for a command: load at start (returns what it loaded), save at the end.
class KernelCacheSession {
 public:
  KernelCacheSession();
  ~KernelCacheSession();   // saves
  KernelCacheSession(const KernelCacheSession&) = delete;
  KernelCacheSession& operator=(const KernelCacheSession&) = delete;
  void save();

 private:
  std::optional<std::string> file_;
  std::string key_;
};

}  // namespace colossal
