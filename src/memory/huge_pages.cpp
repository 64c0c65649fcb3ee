#include "src/memory/huge_pages.h"

#include <c10/core/StorageImpl.h>
#include <sys/mman.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <thread>
#include <unordered_set>

#include "src/core/error.h"

namespace colossal::memory {
namespace {

constexpr int64_t kHugePage = int64_t{2} << 20;   // x86-64's transparent huge page
constexpr int64_t kAlign = 64;                    // a cache line: the kernels' vector loads never straddle two

int64_t round_up(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

std::string huge_page_mode() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  if (!std::getline(f, line)) return "unknown";
  const auto open = line.find('['), close = line.find(']');
  return open == std::string::npos || close == std::string::npos || close < open ? "unknown" : line.substr(open + 1, close - open - 1);
}

// The allocation: freed when the last storage in it goes.
struct Arena {
  void* base;
  explicit Arena(void* b) : base(b) {}
  ~Arena() { std::free(base); }
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
};

void release(void* ctx) { delete static_cast<std::shared_ptr<Arena>*>(ctx); }

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23   // Linux 5.14; older kernels refuse it (EINVAL) and the writes fault the pages
#endif

}  // namespace

// Faults [base, base + size) in, a huge page at a time from the end, until it meets pages already there
// or is stopped. MADV_POPULATE_WRITE never changes a byte, so racing the writes from the start is safe.
class Prefault {
 public:
  Prefault(std::shared_ptr<Arena> arena, char* base, int64_t size)
      : arena_(std::move(arena)), thread_([this, base, size] {
          for (int64_t end = size; end > 0 && !stop_.load(std::memory_order_relaxed); end -= kHugePage)
            if (::madvise(base + end - kHugePage, static_cast<size_t>(kHugePage), MADV_POPULATE_WRITE) != 0) return;
        }) {}
  ~Prefault() {
    stop_.store(true);
    thread_.join();
  }
  Prefault(const Prefault&) = delete;
  Prefault& operator=(const Prefault&) = delete;

 private:
  std::shared_ptr<Arena> arena_;   // the memory outlives the thread
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

HugePagePlacement move_to_huge_pages(const std::vector<at::Tensor>& tensors, Values values) {
  HugePagePlacement placed;
  placed.mode = huge_page_mode();
  std::vector<c10::StorageImpl*> storages;
  std::unordered_set<c10::StorageImpl*> seen;
  int64_t total = 0;
  for (const auto& t : tensors) {
    if (!t.defined() || !t.device().is_cpu() || !t.has_storage()) continue;
    c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
    if (s->nbytes() == 0 || s->data() == nullptr || !seen.insert(s).second) continue;
    storages.push_back(s);
    total += round_up(static_cast<int64_t>(s->nbytes()), kAlign);
  }
  if (storages.empty()) return placed;
  const int64_t size = round_up(total, kHugePage);
  void* base = std::aligned_alloc(kHugePage, static_cast<size_t>(size));
  if (!base) return placed;   // no room for a second copy: the weights stay where they are
  // Before the first touch, so the faults take whole huge pages. Refused where the kernel has none
  // (EINVAL): the copy still holds the weights, on small pages.
  ::madvise(base, static_cast<size_t>(size), MADV_HUGEPAGE);
  const auto arena = std::make_shared<Arena>(base);
  auto prefault = std::make_shared<Prefault>(arena, static_cast<char*>(base), size);
  auto* at = static_cast<char*>(base);
  for (c10::StorageImpl* s : storages) {
    const auto n = static_cast<int64_t>(s->nbytes());
    if (values == Values::keep) std::memcpy(at, s->data(), static_cast<size_t>(n));
    // Every tensor and view over this storage now reads the copy; the old memory goes with the
    // returned DataPtr here.
    s->set_data_ptr(c10::DataPtr(at, new std::shared_ptr<Arena>(arena), &release, c10::Device(c10::kCPU)));
    at += round_up(n, kAlign);
    placed.bytes += n;
    ++placed.storages;
  }
  if (values == Values::discard) placed.prefault = std::move(prefault);   // else joined here, the copy done
  return placed;
}

bool huge_pages_wanted_from(const char* value, bool by_default) {
  if (!value || !*value) return by_default;
  if (std::strcmp(value, "1") == 0) return true;
  if (std::strcmp(value, "0") == 0) return false;
  throw Error(std::string("COLOSSAL_HUGE_PAGES=\"") + value +
              "\" is not a choice (valid: 1 to put a CPU model's weights on huge pages, 0 not to, unset for the command's default)");
}

bool huge_pages_wanted(bool by_default) { return huge_pages_wanted_from(std::getenv("COLOSSAL_HUGE_PAGES"), by_default); }

}  // namespace colossal::memory
