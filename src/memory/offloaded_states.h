// OffloadedStates: this rank's optimizer states for every chunk kept on NVMe (an OffloadFile), with a
// few host staging buffers that hold the chunks being worked on. The optimizer streams through the
// chunks: while chunk c is updated, chunk c+1 is read and chunk c-1 written back, so with three
// staging buffers the disk and the update overlap (ZeRO-Infinity's optimizer offload, on our chunks).
//
// Checkpoint saves and loads reach chunks in their own order through the same buffers, which act as a
// small write-back cache: a staged chunk is read from, or changed in, memory, and a changed one goes
// back to the file when its buffer is needed for another chunk or at flush().
#pragma once
#include <ATen/core/Tensor.h>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "src/memory/offload_file.h"

namespace colossal::memory {

class OffloadedStates {
 public:
  // `numels[c]`: the length of chunk c's shard; `segments`: the tensors kept per chunk (one per
  // optimizer state), each `numels[c]` long, zeros until written. `what` names the file in errors.
  OffloadedStates(std::vector<int64_t> numels, int segments, at::ScalarType dtype, const std::string& dir, const std::string& what,
                  int staging = 3, const OffloadFileOptions& options = {});
  ~OffloadedStates();

  int64_t chunks() const { return static_cast<int64_t>(numels_.size()); }
  // Chunk c's segments, in a staging buffer (read from the file first, waiting for it, when not staged).
  // `change`: the caller will write them, so they go back to the file later. The tensors stay valid
  // until `staging - 1` other chunks have been acquired or prefetched.
  const std::vector<at::Tensor>& acquire(int64_t c, bool change);
  void prefetch(int64_t c);    // starts reading chunk c into a staging buffer, unless it is staged
  void writeback(int64_t c);   // starts writing chunk c back now, if it was changed
  void flush();                // every changed chunk written and waited for

  int64_t staged_bytes() const;   // host memory of the staging buffers
  int64_t file_bytes() const { return file_.size(); }
  const OffloadFile& file() const { return file_; }

 private:
  struct Slot;
  int64_t region_bytes(int64_t c) const;   // chunk c's segments in the file, each rounded to kIoAlign
  Slot& stage(int64_t c);                  // a buffer holding chunk c, its read started
  Slot& free_slot();                       // the least recently used buffer, emptied
  void finish_write(Slot& s);

  std::vector<int64_t> numels_, offsets_;   // by chunk: shard length, region's byte offset
  int segments_;
  at::ScalarType dtype_;
  OffloadFile file_;
  std::vector<Slot> slots_;
  uint64_t clock_ = 0;
};

}  // namespace colossal::memory
