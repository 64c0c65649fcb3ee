// Offloaded optimizer states: see offloaded_states.h.
#include "src/memory/offloaded_states.h"

#include <ATen/ATen.h>
#include <algorithm>

#include "src/core/error.h"

namespace colossal::memory {

struct OffloadedStates::Slot {
  int64_t chunk = -1;
  AlignedBuffer buffer;
  std::vector<at::Tensor> views;   // the chunk's segments
  bool changed = false;            // differs from the file
  OffloadFile::Ticket reading = 0, writing = 0;
  uint64_t used = 0;               // for least-recently-used reuse
};

namespace {

int64_t segment_bytes(int64_t numel, at::ScalarType dtype) {
  return io_round_up(numel * static_cast<int64_t>(c10::elementSize(dtype)));
}

int64_t file_bytes_for(const std::vector<int64_t>& numels, int segments, at::ScalarType dtype) {
  int64_t total = 0;
  for (int64_t n : numels) total += segments * segment_bytes(n, dtype);
  return total;
}

}  // namespace

OffloadedStates::OffloadedStates(std::vector<int64_t> numels, int segments, at::ScalarType dtype, const std::string& dir,
                                 const std::string& what, int staging, const OffloadFileOptions& options)
    : numels_(std::move(numels)),
      segments_(segments),
      dtype_(dtype),
      file_(dir, file_bytes_for(numels_, segments, dtype), what, options) {
  if (segments < 1 || staging < 2) throw Error("offload: " + what + " needs a segment and two staging buffers (internal)");
  int64_t at = 0, largest = 0;
  for (size_t c = 0; c < numels_.size(); ++c) {
    offsets_.push_back(at);
    at += region_bytes(static_cast<int64_t>(c));
    largest = std::max(largest, region_bytes(static_cast<int64_t>(c)));
  }
  slots_.resize(static_cast<size_t>(staging));
  for (auto& s : slots_) s.buffer = AlignedBuffer(largest);
}

OffloadedStates::~OffloadedStates() {
  try {
    file_.wait_all();   // nothing may still write into the buffers as they go
  } catch (const Error&) {
  }
}

int64_t OffloadedStates::region_bytes(int64_t c) const { return segments_ * segment_bytes(numels_[static_cast<size_t>(c)], dtype_); }

void OffloadedStates::finish_write(Slot& s) {
  if (s.writing == 0) return;
  const auto t = s.writing;
  s.writing = 0;
  file_.wait(t);
}

OffloadedStates::Slot& OffloadedStates::free_slot() {
  Slot* pick = nullptr;
  for (auto& s : slots_)
    if (s.chunk < 0) {
      pick = &s;
      break;
    }
  if (!pick) pick = &*std::min_element(slots_.begin(), slots_.end(), [](const Slot& a, const Slot& b) { return a.used < b.used; });
  Slot& s = *pick;
  if (s.reading) {   // a prefetch nobody used
    const auto t = s.reading;
    s.reading = 0;
    file_.wait(t);
  }
  if (s.changed) writeback(s.chunk);
  finish_write(s);
  s.chunk = -1;
  s.views.clear();
  return s;
}

OffloadedStates::Slot& OffloadedStates::stage(int64_t c) {
  if (c < 0 || c >= chunks()) throw Error("offload: chunk " + std::to_string(c) + " out of range (internal)");
  for (auto& s : slots_)
    if (s.chunk == c) {
      s.used = ++clock_;
      return s;
    }
  Slot& s = free_slot();
  s.chunk = c;
  s.used = ++clock_;
  const int64_t seg = segment_bytes(numels_[static_cast<size_t>(c)], dtype_);
  for (int k = 0; k < segments_; ++k) s.views.push_back(s.buffer.view(k * seg, numels_[static_cast<size_t>(c)], dtype_));
  s.reading = file_.read(offsets_[static_cast<size_t>(c)], s.buffer.data(), region_bytes(c));
  return s;
}

const std::vector<at::Tensor>& OffloadedStates::acquire(int64_t c, bool change) {
  Slot& s = stage(c);
  if (s.reading) {
    const auto t = s.reading;
    s.reading = 0;
    file_.wait(t);
  }
  finish_write(s);   // its bytes may be read or changed again only once the write has taken them
  s.changed |= change;
  return s.views;
}

void OffloadedStates::prefetch(int64_t c) {
  if (c >= 0 && c < chunks()) stage(c);
}

void OffloadedStates::writeback(int64_t c) {
  for (auto& s : slots_)
    if (s.chunk == c && s.changed) {
      finish_write(s);
      s.writing = file_.write(offsets_[static_cast<size_t>(c)], s.buffer.data(), region_bytes(c));
      s.changed = false;
    }
}

void OffloadedStates::flush() {
  for (auto& s : slots_)
    if (s.changed) writeback(s.chunk);
  for (auto& s : slots_) finish_write(s);
}

int64_t OffloadedStates::staged_bytes() const {
  int64_t n = 0;
  for (const auto& s : slots_) n += s.buffer.size();
  return n;
}

}  // namespace colossal::memory
