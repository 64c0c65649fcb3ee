// OffloadedStates: this rank's optimizer states (and, in mixed precision, master weights) for every
// chunk kept on NVMe (an OffloadFile), with a few host staging buffers that hold the part being worked
// on. Each chunk's shard is cut into slices of at most `slice_numel` elements, the unit of staging: the
// optimizer streams through the slices, reading slice u+1 and writing slice u-1 back while slice u is
// updated, so with three staging buffers the disk and the update overlap (ZeRO-Infinity's optimizer
// offload, on our chunks), and the memory it takes is three slices whatever the largest chunk (GPT-2's
// embedding chunk alone is 31% of the model at 124M).
//
// Checkpoint saves and loads reach chunks in their own order through the same buffers, which act as a
// small write-back cache: a staged slice is read from, or changed in, memory, and a changed one goes
// back to the file when its buffer is needed for another slice or at flush().
#pragma once
#include <ATen/core/Tensor.h>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "src/memory/offload_file.h"

namespace colossal::memory {

// The elements of a chunk's shard that optimizer offload stages at once (16 MiB per fp32 state): three
// slices' states are what the update holds in memory, and a slice is long enough that its transfer
// keeps the disk's queue full.
constexpr int64_t kOffloadSliceNumel = int64_t{1} << 22;

class OffloadedStates {
 public:
  // `numels[c]`: the length of chunk c's shard; `segments`: the tensors kept per chunk, each
  // `numels[c]` long, zeros until written; `slice_numel`: the most elements of a chunk staged at once
  // (0: whole chunks). `what` names the file in errors.
  OffloadedStates(std::vector<int64_t> numels, int segments, at::ScalarType dtype, const std::string& dir, const std::string& what,
                  int64_t slice_numel = 0, int staging = 3, const OffloadFileOptions& options = {});
  ~OffloadedStates();

  struct Slice {
    int64_t chunk = 0, begin = 0, numel = 0;   // [begin, begin + numel) of the chunk's shard
  };
  int64_t chunks() const { return static_cast<int64_t>(numels_.size()); }
  int64_t slices() const { return static_cast<int64_t>(slices_.size()); }
  const Slice& slice(int64_t s) const { return slices_[static_cast<size_t>(s)]; }
  int64_t first_slice(int64_t chunk) const { return first_[static_cast<size_t>(chunk)]; }   // chunk c: [first(c), first(c+1))

  // Slice s's segments, in a staging buffer (read from the file first, waiting for it, when not staged).
  // `change`: the caller will write them, so they go back to the file later. The tensors stay valid
  // until `staging - 1` other slices have been acquired or prefetched.
  const std::vector<at::Tensor>& acquire(int64_t s, bool change);
  void prefetch(int64_t s);    // starts reading slice s into a staging buffer, unless it is staged
  void writeback(int64_t s);   // starts writing slice s back now, if it was changed
  void flush();                // every changed slice written and waited for

  // Segment k of chunk c over [begin, begin + out.numel()), copied out of or into the slices it spans.
  void read(int64_t chunk, int k, int64_t begin, at::Tensor& out);
  void write(int64_t chunk, int k, int64_t begin, const at::Tensor& in);

  // Segment k of chunk c read straight from the file into `buffer` (ZeRO-3's parameter fetch: the
  // master only, not the states beside it), each slice's part at its own aligned place in it; wait()
  // before touching `pieces`. A staged slice changed in memory is written back first, so the read sees it.
  struct SegmentRead {
    std::vector<OffloadFile::Ticket> tickets;
    std::vector<std::pair<int64_t, at::Tensor>> pieces;   // (its first element in the chunk's shard, its values)
  };
  int64_t segment_read_bytes(int64_t chunk) const;   // what `buffer` must hold
  SegmentRead read_segment(int64_t chunk, int k, const AlignedBuffer& buffer);
  void wait(SegmentRead& read);

  int64_t staged_bytes() const;   // host memory of the staging buffers
  int64_t file_bytes() const { return file_.size(); }
  int64_t chunk_file_bytes(int64_t chunk) const;   // chunk c's slices' regions
  const OffloadFile& file() const { return file_; }

 private:
  struct Slot;
  Slot& stage(int64_t s);   // a buffer holding slice s, its read started
  Slot& free_slot();        // the least recently used buffer, emptied
  void finish_write(Slot& slot);
  // The slices of chunk c that [begin, begin + numel) overlaps, with each overlap's place in both.
  template <typename Fn>
  void each_overlap(int64_t chunk, int64_t begin, int64_t numel, Fn&& fn);

  std::vector<int64_t> numels_;
  std::vector<Slice> slices_;
  std::vector<int64_t> first_;      // by chunk: its first slice (one entry more: the end)
  std::vector<int64_t> offsets_;    // by slice: its region's byte offset in the file
  std::vector<bool> written_;       // by slice: written at least once (else all zeros: nothing to read)
  int segments_;
  at::ScalarType dtype_;
  OffloadFile file_;
  std::vector<Slot> slots_;
  uint64_t clock_ = 0;
};

}  // namespace colossal::memory
