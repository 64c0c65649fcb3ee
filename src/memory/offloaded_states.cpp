// Offloaded optimizer states: see offloaded_states.h.
#include "src/memory/offloaded_states.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <algorithm>
#include <cstring>

#include "src/core/error.h"

namespace colossal::memory {

struct OffloadedStates::Slot {
  int64_t slice = -1;
  AlignedBuffer buffer;
  std::vector<at::Tensor> views;   // the slice's segments
  bool changed = false;            // differs from the file
  OffloadFile::Ticket reading = 0, writing = 0;
  uint64_t used = 0;               // for least-recently-used reuse
};

namespace {

int64_t segment_bytes(int64_t numel, at::ScalarType dtype) {
  return io_round_up(numel * static_cast<int64_t>(c10::elementSize(dtype)));
}

// Cuts each chunk's shard into slices; a slice's region holds its segments one after another.
std::vector<OffloadedStates::Slice> cut(const std::vector<int64_t>& numels, int64_t slice_numel) {
  std::vector<OffloadedStates::Slice> out;
  for (size_t c = 0; c < numels.size(); ++c) {
    const int64_t n = numels[c], step = slice_numel > 0 ? slice_numel : std::max<int64_t>(n, 1);
    int64_t begin = 0;
    do {
      out.push_back({static_cast<int64_t>(c), begin, std::min(step, n - begin)});
      begin += step;
    } while (begin < n);
  }
  return out;
}

int64_t file_bytes_for(const std::vector<OffloadedStates::Slice>& slices, int segments, at::ScalarType dtype) {
  int64_t total = 0;
  for (const auto& s : slices) total += segments * segment_bytes(s.numel, dtype);
  return total;
}

}  // namespace

OffloadedStates::OffloadedStates(std::vector<int64_t> numels, int segments, at::ScalarType dtype, const std::string& dir,
                                 const std::string& what, int64_t slice_numel, int staging, const OffloadFileOptions& options)
    : numels_(std::move(numels)),
      slices_(cut(numels_, slice_numel)),
      segments_(segments),
      dtype_(dtype),
      file_(dir, file_bytes_for(slices_, segments, dtype), what, options) {
  if (segments < 1 || staging < 2) throw Error("offload: " + what + " needs a segment and two staging buffers (internal)");
  int64_t at = 0, largest = 0;
  for (size_t s = 0; s < slices_.size(); ++s) {
    if (first_.size() <= static_cast<size_t>(slices_[s].chunk)) first_.push_back(static_cast<int64_t>(s));
    const int64_t bytes = segments_ * segment_bytes(slices_[s].numel, dtype_);
    offsets_.push_back(at);
    at += bytes;
    largest = std::max(largest, bytes);
  }
  first_.push_back(slices());
  written_.assign(slices_.size(), false);
  slots_.resize(static_cast<size_t>(staging));
  for (auto& s : slots_) s.buffer = AlignedBuffer(largest);
}

OffloadedStates::~OffloadedStates() {
  try {
    file_.wait_all();   // nothing may still write into the buffers as they go
  } catch (const Error&) {
  }
}

void OffloadedStates::finish_write(Slot& slot) {
  if (slot.writing == 0) return;
  const auto t = slot.writing;
  slot.writing = 0;
  file_.wait(t);
}

OffloadedStates::Slot& OffloadedStates::free_slot() {
  Slot* pick = nullptr;
  for (auto& s : slots_)
    if (s.slice < 0) {
      pick = &s;
      break;
    }
  if (!pick) pick = &*std::min_element(slots_.begin(), slots_.end(), [](const Slot& a, const Slot& b) { return a.used < b.used; });
  Slot& slot = *pick;
  if (slot.reading) {   // a prefetch nobody used
    const auto t = slot.reading;
    slot.reading = 0;
    file_.wait(t);
  }
  if (slot.changed) writeback(slot.slice);
  finish_write(slot);
  slot.slice = -1;
  slot.views.clear();
  return slot;
}

OffloadedStates::Slot& OffloadedStates::stage(int64_t s) {
  if (s < 0 || s >= slices()) throw Error("offload: slice " + std::to_string(s) + " out of range (internal)");
  for (auto& slot : slots_)
    if (slot.slice == s) {
      slot.used = ++clock_;
      return slot;
    }
  Slot& slot = free_slot();
  slot.slice = s;
  slot.used = ++clock_;
  const Slice& sl = slices_[static_cast<size_t>(s)];
  const int64_t seg = segment_bytes(sl.numel, dtype_);
  for (int k = 0; k < segments_; ++k) slot.views.push_back(slot.buffer.view(k * seg, sl.numel, dtype_));
  // A slice never written holds zeros (the file is allocated, not written, up front): filling the buffer
  // saves reading it, which at the start of a large model's run is the whole file read once for nothing.
  if (written_[static_cast<size_t>(s)])
    slot.reading = file_.read(offsets_[static_cast<size_t>(s)], slot.buffer.data(), segments_ * seg);
  else
    std::memset(slot.buffer.data(), 0, static_cast<size_t>(segments_ * seg));
  return slot;
}

const std::vector<at::Tensor>& OffloadedStates::acquire(int64_t s, bool change) {
  Slot& slot = stage(s);
  if (slot.reading) {
    const auto t = slot.reading;
    slot.reading = 0;
    file_.wait(t);
  }
  finish_write(slot);   // its bytes may be read or changed again only once the write has taken them
  slot.changed |= change;
  return slot.views;
}

void OffloadedStates::prefetch(int64_t s) {
  if (s >= 0 && s < slices()) stage(s);
}

void OffloadedStates::writeback(int64_t s) {
  for (auto& slot : slots_)
    if (slot.slice == s && slot.changed) {
      finish_write(slot);
      const int64_t bytes = segments_ * segment_bytes(slices_[static_cast<size_t>(s)].numel, dtype_);
      slot.writing = file_.write(offsets_[static_cast<size_t>(s)], slot.buffer.data(), bytes);
      slot.changed = false;
      written_[static_cast<size_t>(s)] = true;
    }
}

void OffloadedStates::flush() {
  for (auto& slot : slots_)
    if (slot.changed) writeback(slot.slice);
  for (auto& slot : slots_) finish_write(slot);
}

template <typename Fn>
void OffloadedStates::each_overlap(int64_t chunk, int64_t begin, int64_t numel, Fn&& fn) {
  if (begin < 0 || begin + numel > numels_[static_cast<size_t>(chunk)])
    throw Error("offload: a range past chunk " + std::to_string(chunk) + "'s shard (internal)");
  for (int64_t s = first_slice(chunk); s < first_slice(chunk + 1); ++s) {
    const Slice& sl = slices_[static_cast<size_t>(s)];
    const int64_t lo = std::max(begin, sl.begin), hi = std::min(begin + numel, sl.begin + sl.numel);
    if (lo < hi) fn(s, lo - sl.begin, lo - begin, hi - lo);   // slice, offset in it, offset in the range, length
  }
}

void OffloadedStates::read(int64_t chunk, int k, int64_t begin, at::Tensor& out) {
  at::NoGradGuard no_grad;
  each_overlap(chunk, begin, out.numel(), [&](int64_t s, int64_t in_slice, int64_t in_range, int64_t n) {
    out.narrow(0, in_range, n).copy_(acquire(s, false)[static_cast<size_t>(k)].narrow(0, in_slice, n));
  });
}

void OffloadedStates::write(int64_t chunk, int k, int64_t begin, const at::Tensor& in) {
  at::NoGradGuard no_grad;
  each_overlap(chunk, begin, in.numel(), [&](int64_t s, int64_t in_slice, int64_t in_range, int64_t n) {
    acquire(s, true)[static_cast<size_t>(k)].narrow(0, in_slice, n).copy_(in.narrow(0, in_range, n));
  });
}

int64_t OffloadedStates::chunk_file_bytes(int64_t chunk) const {
  return segments_ * segment_read_bytes(chunk);
}

int64_t OffloadedStates::segment_read_bytes(int64_t chunk) const {
  int64_t n = 0;
  for (int64_t s = first_slice(chunk); s < first_slice(chunk + 1); ++s) n += segment_bytes(slices_[static_cast<size_t>(s)].numel, dtype_);
  return n;
}

OffloadedStates::SegmentRead OffloadedStates::read_segment(int64_t chunk, int k, const AlignedBuffer& buffer) {
  if (chunk < 0 || chunk >= chunks() || k < 0 || k >= segments_ || buffer.size() < segment_read_bytes(chunk))
    throw Error("offload: segment " + std::to_string(k) + " of chunk " + std::to_string(chunk) + " read out of range (internal)");
  const int64_t lo = first_slice(chunk), hi = first_slice(chunk + 1);
  for (auto& slot : slots_)   // the file must hold what memory holds before it is read around the buffers
    if (slot.slice >= lo && slot.slice < hi) {
      if (slot.changed) writeback(slot.slice);
      finish_write(slot);
    }
  SegmentRead r;
  int64_t at = 0;
  for (int64_t s = lo; s < hi; ++s) {
    const Slice& sl = slices_[static_cast<size_t>(s)];
    const int64_t seg = segment_bytes(sl.numel, dtype_);
    if (written_[static_cast<size_t>(s)])
      r.tickets.push_back(file_.read(offsets_[static_cast<size_t>(s)] + k * seg, buffer.data() + at, seg));
    else
      std::memset(buffer.data() + at, 0, static_cast<size_t>(seg));
    r.pieces.emplace_back(sl.begin, buffer.view(at, sl.numel, dtype_));
    at += seg;
  }
  return r;
}

void OffloadedStates::wait(SegmentRead& read) {
  auto tickets = std::move(read.tickets);
  read.tickets.clear();
  for (auto t : tickets) file_.wait(t);
}

int64_t OffloadedStates::staged_bytes() const {
  int64_t n = 0;
  for (const auto& s : slots_) n += s.buffer.size();
  return n;
}

}  // namespace colossal::memory
