// OffloadFile: one file under nvme_path holding fixed regions (each chunk's optimizer states, later its
// parameters), read and written asynchronously so the disk works while the CPU computes (Gemini's NVMe
// tier, ZeRO-Infinity's idea).
//
// - O_DIRECT where the file system allows it: bytes go between the caller's buffer and the disk with no
//   second copy in the page cache, which would otherwise grow in the very host memory being offloaded
//   from. Offsets and buffers are therefore aligned to kIoAlign (AlignedBuffer).
// - io_uring (liburing) with up to queue_depth requests in flight, a region split into requests of
//   request_bytes so one chunk keeps the device's queues full. Where liburing is missing at build time
//   or the kernel refuses io_uring, the same requests run through pread/pwrite on the I/O thread.
// - The file has no name (O_TMPFILE, else unlinked at once): it goes with the process however it ends,
//   so a killed run leaves nothing for the next start to clean. Its whole size is allocated up front,
//   so a disk too small fails before training, never in the middle of a step.
#pragma once
#include <ATen/core/Tensor.h>
#include <cstdint>
#include <memory>
#include <string>

namespace colossal::memory {

constexpr int64_t kIoAlign = 4096;
inline int64_t io_round_up(int64_t bytes) { return (bytes + kIoAlign - 1) / kIoAlign * kIoAlign; }

// Zero-filled host memory aligned to kIoAlign, its size rounded up to a multiple of it.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(int64_t bytes);
  ~AlignedBuffer();
  AlignedBuffer(AlignedBuffer&& o) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  char* data() const { return data_; }
  int64_t size() const { return size_; }
  // A 1-D tensor over [byte_offset, byte_offset + numel elements): a view, valid while the buffer lives.
  at::Tensor view(int64_t byte_offset, int64_t numel, at::ScalarType dtype) const;

 private:
  char* data_ = nullptr;
  int64_t size_ = 0;
};

struct OffloadFileOptions {
  int queue_depth = 16;               // requests in flight
  int64_t request_bytes = 1 << 20;    // a region's transfer is cut into requests of this size
  bool io_uring = true;               // false: pread/pwrite on the I/O thread
  bool direct = true;                 // O_DIRECT where allowed; false: through the page cache
  // Tests: the most bytes one system call moves, so transfers come back short as a device may return
  // them (0: no cap).
  int64_t max_transfer = 0;
};

class OffloadFile {
 public:
  using Ticket = int64_t;
  // A file of `bytes` (rounded up to kIoAlign) under directory `dir`; `what` names it in errors
  // ("nvme_path /mnt/nvme (optimizer states)"). An Error when dir is missing, not a writable directory,
  // or has too little free space.
  OffloadFile(const std::string& dir, int64_t bytes, const std::string& what, const OffloadFileOptions& options = {});
  // An existing file at `path`, opened read-only (a checkpoint read in place): size() is its length,
  // reads take the same aligned offsets and may run past its end (the bytes there are left as they
  // were), and write() is refused. An Error naming `what` when it cannot be opened.
  static std::unique_ptr<OffloadFile> open_for_reading(const std::string& path, const std::string& what,
                                                       const OffloadFileOptions& options = {});
  ~OffloadFile();   // waits for the requests in flight
  OffloadFile(const OffloadFile&) = delete;
  OffloadFile& operator=(const OffloadFile&) = delete;

  // Asynchronous transfers of io_round_up(bytes) bytes at `offset` (a multiple of kIoAlign) between the
  // file and `buffer` (aligned to kIoAlign, holding io_round_up(bytes)); the buffer must stay untouched
  // until the ticket is waited for.
  Ticket read(int64_t offset, void* buffer, int64_t bytes);
  Ticket write(int64_t offset, const void* buffer, int64_t bytes);
  // Waits for the transfer; an Error naming the file, offset and cause when it failed.
  void wait(Ticket ticket);
  void wait_all();

  int64_t size() const;
  bool direct() const;      // O_DIRECT in use
  bool io_uring() const;    // io_uring in use (else pread/pwrite)
  int64_t bytes_read() const;
  int64_t bytes_written() const;

 private:
  struct Impl;
  OffloadFile(const OffloadFileOptions& options, const std::string& what);   // set up, no file yet
  void start();                                                             // the I/O thread, once the file is open
  std::unique_ptr<Impl> impl_;
};

// Free bytes in the file system holding `dir` (statvfs), or an Error naming `what` when dir is not a
// writable directory: what --dry-run and the plan check before anything is allocated.
int64_t offload_dir_free_bytes(const std::string& dir, const std::string& what);

}  // namespace colossal::memory
