// Weights a CPU decoder reads every step, moved onto transparent huge pages.
//
// A decoding step reads every weight once, so its speed is the rate the cores stream memory. On an AMD
// EPYC (Zen 5, 2 cores, 2026-12-07) the GEMV over GPT-2 124M's layers read 57-62 GB/s from weights on
// 2 MiB pages against 39-53 GB/s from the same weights on 4 KiB pages (a harness, alternating), and
// whole decodes ran 1.05-1.11x faster: each 4 KiB page is a TLB miss and a place where the hardware
// prefetchers stop and start again. LibTorch's allocator takes large blocks from glibc, which maps them
// with 4 KiB pages unless the system's transparent_hugepage setting is "always" (Debian's default is
// "madvise"), so the weights go into one allocation advised with MADV_HUGEPAGE. Where the kernel has no
// transparent huge pages, or they are "never", the allocation is made all the same (same bytes) and
// its pages are simply small.
//
// The first touch of a huge page is the kernel zeroing 2 MiB. On bare metal that is cheaper than 512
// small pages' faults, but a VM whose balloon reports free memory to its host (as this machine's does)
// hands back exactly such free 2 MiB blocks, and touching them again makes the host back them anew:
// 352 MB took 0.5-1.0 s to fault in there against 0.03 s when the blocks had not yet been reported.
// So a thread faults the allocation in (MADV_POPULATE_WRITE) from its end while the weights are
// written from its start, and the two halves cost one (1.07 s of faults became 0.24 s behind 0.3 s of
// other work, a harness).
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace colossal::memory {

class Prefault;

struct HugePagePlacement {
  int64_t bytes = 0;      // the storages' bytes now in the allocation
  int64_t storages = 0;   // how many distinct storages moved (tied weights and views share one)
  std::string mode;       // /sys/kernel/mm/transparent_hugepage/enabled's choice: "always", "madvise", "never" or "unknown"
  // Values::discard: the thread still faulting the allocation in from its end, stopped and joined when
  // the last copy of this placement goes (keep it until the weights are written).
  std::shared_ptr<Prefault> prefault;
};

// Moves the storage of every defined CPU tensor in `tensors` into one allocation advised for huge pages,
// each storage at a 64-byte boundary. Every tensor and view sharing a storage keeps sharing it, with the
// same values, sizes, strides and offsets: the storage's memory is swapped in place (tied embeddings
// and parameters' handles held elsewhere stay what they were). The old memory is freed storage by
// storage as the copy goes, so the process holds little more than the weights once. Tensors on other
// devices and empty storages are left alone. Call it before anything keeps raw pointers into them
// (the kernels take pointers per call).
// Values::discard: the tensors are about to be written whole (a model built without initial values,
// before its checkpoint is read into it), so nothing is copied and their values are then undefined, as
// at::empty's; the weights are then read straight onto the huge pages, and the small pages they would
// have taken are never touched. Values::keep copies them (from the start, with the thread faulting
// from the end) and returns once all is done.
enum class Values { keep, discard };
HugePagePlacement move_to_huge_pages(const std::vector<at::Tensor>& tensors, Values values = Values::keep);

// Whether a CPU model's weights go onto huge pages: COLOSSAL_HUGE_PAGES "1" yes, "0" no, unset (or
// empty) the command's default, `by_default`; anything else is an Error naming the variable and its
// valid values. `colossal serve` defaults to yes: it loads once and decodes for as long as it runs.
// `colossal infer` defaults to no: on a VM that reports free memory to its host, faulting the huge
// pages in cost a 124M model 0.3-0.8 s more loading, and its decodes' 5-11% repaid that only past about
// a thousand steps.
bool huge_pages_wanted(bool by_default);
bool huge_pages_wanted_from(const char* value, bool by_default);

}  // namespace colossal::memory
