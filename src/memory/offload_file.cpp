// Offload file: see offload_file.h.
#include "src/memory/offload_file.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

// Found by CMake (colossal::liburing), which also links it; absent, the pread/pwrite path alone is built.
#if __has_include(<liburing.h>)
#include <liburing.h>
#define COLOSSAL_HAVE_LIBURING 1
#endif

#include "src/core/error.h"
#include "src/core/text.h"

namespace colossal::memory {

AlignedBuffer::AlignedBuffer(int64_t bytes) : size_(io_round_up(std::max<int64_t>(bytes, 1))) {
  void* p = nullptr;
  if (posix_memalign(&p, kIoAlign, static_cast<size_t>(size_)) != 0)
    throw Error("offload: cannot allocate a " + human_bytes(size_) + " staging buffer (host memory exhausted)");
  data_ = static_cast<char*>(p);
  std::memset(data_, 0, static_cast<size_t>(size_));
}

AlignedBuffer::~AlignedBuffer() { std::free(data_); }

AlignedBuffer::AlignedBuffer(AlignedBuffer&& o) noexcept : data_(o.data_), size_(o.size_) {
  o.data_ = nullptr;
  o.size_ = 0;
}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& o) noexcept {
  std::swap(data_, o.data_);
  std::swap(size_, o.size_);
  return *this;
}

at::Tensor AlignedBuffer::view(int64_t byte_offset, int64_t numel, at::ScalarType dtype) const {
  if (byte_offset < 0 || byte_offset + numel * static_cast<int64_t>(c10::elementSize(dtype)) > size_)
    throw Error("offload: a view past the end of a staging buffer (internal)");
  return at::from_blob(data_ + byte_offset, {numel}, [](void*) {}, at::TensorOptions().dtype(dtype));
}

namespace {

std::string errno_text(int e) { return std::strerror(e); }

struct Request {
  OffloadFile::Ticket ticket = 0;
  bool write = false;
  int64_t offset = 0;
  char* ptr = nullptr;
  int64_t bytes = 0;
};

struct TicketState {
  int64_t parts = 0;   // requests not yet finished
  std::string error;   // the first failure
};

}  // namespace

int64_t offload_dir_free_bytes(const std::string& dir, const std::string& what) {
  struct stat st{};
  if (::stat(dir.c_str(), &st) != 0)
    throw Error(what + ": " + dir + " does not exist (" + errno_text(errno) + "); give a directory on a local disk");
  if (!S_ISDIR(st.st_mode)) throw Error(what + ": " + dir + " is not a directory; give a directory on a local disk");
  if (::access(dir.c_str(), W_OK | X_OK) != 0) throw Error(what + ": " + dir + " is not writable (" + errno_text(errno) + ")");
  struct statvfs vfs{};
  if (::statvfs(dir.c_str(), &vfs) != 0) throw Error(what + ": cannot read the free space of " + dir + " (" + errno_text(errno) + ")");
  return static_cast<int64_t>(vfs.f_bavail) * static_cast<int64_t>(vfs.f_frsize);
}

struct OffloadFile::Impl {
  std::string what, dir;
  OffloadFileOptions options;
  int fd = -1;
  int64_t size = 0;
  bool direct = false, uring = false;
  bool read_only = false;   // an existing file read in place: reads may end at its end
#ifdef COLOSSAL_HAVE_LIBURING
  struct io_uring ring{};
#endif
  std::mutex mu;
  std::condition_variable work, done;
  std::deque<Request> queue;   // waiting to be issued
  int inflight = 0;            // issued to io_uring, not completed
  std::unordered_map<Ticket, TicketState> tickets;
  Ticket next = 1;
  bool stop = false;
  std::atomic<int64_t> read_bytes{0}, written_bytes{0};
  std::thread thread;

  void open_file();
  void open_existing(const std::string& path);
  Ticket post(bool write, int64_t offset, char* ptr, int64_t bytes);
  // A request's transfer of `moved` bytes (negative: -errno) finished; returns the remainder to issue
  // again when it came back short, with the ticket's bookkeeping done under the lock.
  std::optional<Request> finished(const Request& r, int64_t moved);
  // The bytes one system call is asked to move for `r` (max_transfer caps it in tests).
  int64_t transfer(const Request& r) const { return options.max_transfer > 0 ? std::min(r.bytes, options.max_transfer) : r.bytes; }
  void run_sync();
#ifdef COLOSSAL_HAVE_LIBURING
  void run_uring();
  void issue(const Request& r);   // caller holds mu
  void issue_queued();            // caller holds mu
#endif
};

void OffloadFile::Impl::open_file() {
  const int64_t free_bytes = offload_dir_free_bytes(dir, what);
  // Unnamed where the file system supports it; O_DIRECT where it allows it (tmpfs does not).
  for (const bool want_direct : {options.direct, false}) {
    const int flags = O_RDWR | O_CLOEXEC | (want_direct ? O_DIRECT : 0);
    fd = ::open(dir.c_str(), O_TMPFILE | flags, 0600);
    if (fd < 0 && (errno == EOPNOTSUPP || errno == EISDIR || errno == ENOENT)) {
      // No O_TMPFILE here: a named file, unlinked at once.
      std::string path = dir + "/colossal-offload-XXXXXX";
      fd = ::mkostemp(path.data(), flags & ~O_RDWR);
      if (fd >= 0) ::unlink(path.c_str());
    }
    if (fd >= 0) {
      direct = want_direct;
      break;
    }
    if (errno != EINVAL) break;   // EINVAL: no O_DIRECT on this file system; try buffered
  }
  if (fd < 0) throw Error(what + ": cannot create a file in " + dir + " (" + errno_text(errno) + ")");
  if (free_bytes < size)
    throw Error(what + ": the offload needs " + human_bytes(size) + " in " + dir + ", which has " + human_bytes(free_bytes) +
                " free; free space, choose another nvme_path or offload less");
  const int rc = ::posix_fallocate(fd, 0, size);
  if (rc == ENOSPC)
    throw Error(what + ": the offload needs " + human_bytes(size) + " in " + dir + " and the disk ran out while reserving it");
  if (rc != 0 && ::ftruncate(fd, size) != 0)
    throw Error(what + ": cannot size a " + human_bytes(size) + " file in " + dir + " (" + errno_text(errno) + ")");
}

void OffloadFile::Impl::open_existing(const std::string& path) {
  for (const bool want_direct : {options.direct, false}) {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (want_direct ? O_DIRECT : 0));
    if (fd >= 0) {
      direct = want_direct;
      break;
    }
    if (errno != EINVAL) break;   // EINVAL: no O_DIRECT on this file system; read through the page cache
  }
  if (fd < 0) throw Error(what + ": cannot open " + path + " (" + errno_text(errno) + ")");
  struct stat st{};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(what + ": " + path + " is not a regular file");
  }
  size = static_cast<int64_t>(st.st_size);
  read_only = true;
}

OffloadFile::Ticket OffloadFile::Impl::post(bool write, int64_t offset, char* ptr, int64_t bytes) {
  const int64_t total = io_round_up(bytes);
  if (write && read_only) throw Error(what + ": the file is open for reading only (internal)");
  const int64_t end = read_only ? io_round_up(size) : size;   // a read in place may run past the file's last byte
  if (offset % kIoAlign != 0 || reinterpret_cast<uintptr_t>(ptr) % kIoAlign != 0 || bytes < 0 || offset + total > end)
    throw Error(what + ": a transfer of " + std::to_string(bytes) + " bytes at offset " + std::to_string(offset) +
                " is unaligned or past the file's " + std::to_string(size) + " bytes (internal)");
  std::lock_guard<std::mutex> lock(mu);
  const Ticket t = next++;
  TicketState& state = tickets[t];
  for (int64_t at = 0; at < total; at += options.request_bytes) {
    queue.push_back({t, write, offset + at, ptr + at, std::min(options.request_bytes, total - at)});
    ++state.parts;
  }
#ifdef COLOSSAL_HAVE_LIBURING
  if (uring) {
    issue_queued();
    return t;
  }
#endif
  work.notify_one();
  return t;
}

std::optional<Request> OffloadFile::Impl::finished(const Request& r, int64_t moved) {
  if (moved > 0) (r.write ? written_bytes : read_bytes) += moved;
  // A file read in place ends where it ends: a request reaching past it is done at its last byte.
  const bool at_end = read_only && moved >= 0 && r.offset + moved >= size;
  if (moved > 0 && moved < r.bytes && !at_end)   // short: the rest goes again
    return Request{r.ticket, r.write, r.offset + moved, r.ptr + moved, r.bytes - moved};
  TicketState& state = tickets.at(r.ticket);
  if (moved <= 0 && !at_end && state.error.empty()) {
    const std::string op = r.write ? "write" : "read";
    state.error = what + ": " + op + " of " + std::to_string(r.bytes) + " bytes at offset " + std::to_string(r.offset) +
                  " failed: " + (moved == 0 ? "the file ends early" : errno_text(static_cast<int>(-moved))) +
                  (moved == -ENOSPC ? " (the disk is full)" : "");
  }
  if (--state.parts == 0) done.notify_all();
  return std::nullopt;
}

// pread/pwrite, one request at a time on the I/O thread.
void OffloadFile::Impl::run_sync() {
  std::unique_lock<std::mutex> lock(mu);
  for (;;) {
    work.wait(lock, [&] { return stop || !queue.empty(); });
    if (queue.empty()) return;   // stopping, nothing left
    Request r = queue.front();
    queue.pop_front();
    lock.unlock();
    const int64_t n = transfer(r);
    ssize_t moved;
    do {
      moved = r.write ? ::pwrite(fd, r.ptr, static_cast<size_t>(n), r.offset) : ::pread(fd, r.ptr, static_cast<size_t>(n), r.offset);
    } while (moved < 0 && errno == EINTR);
    const int64_t result = moved < 0 ? -errno : moved;
    lock.lock();
    if (auto rest = finished(r, result)) queue.push_front(*rest);
  }
}

#ifdef COLOSSAL_HAVE_LIBURING
void OffloadFile::Impl::issue(const Request& r) {
  io_uring_sqe* sqe = io_uring_get_sqe(&ring);
  const auto n = static_cast<unsigned>(transfer(r));
  if (r.write)
    io_uring_prep_write(sqe, fd, r.ptr, n, static_cast<__u64>(r.offset));
  else
    io_uring_prep_read(sqe, fd, r.ptr, n, static_cast<__u64>(r.offset));
  io_uring_sqe_set_data(sqe, new Request(r));
  ++inflight;
}

void OffloadFile::Impl::issue_queued() {
  int issued = 0;
  while (!queue.empty() && inflight < options.queue_depth) {
    issue(queue.front());
    queue.pop_front();
    ++issued;
  }
  if (issued > 0) io_uring_submit(&ring);
}

// Reaps completions; requests are issued by whoever posts them and, once the queue is full, here as
// earlier ones complete. The submission side is guarded by mu, the completion side is this thread's.
void OffloadFile::Impl::run_uring() {
  for (;;) {
    io_uring_cqe* cqe = nullptr;
    const int rc = io_uring_wait_cqe(&ring, &cqe);
    if (rc == -EINTR) continue;
    if (rc < 0) {   // the ring itself failed: fail everything outstanding
      std::lock_guard<std::mutex> lock(mu);
      for (auto& [t, state] : tickets) {
        if (state.error.empty()) state.error = what + ": io_uring failed (" + errno_text(-rc) + ")";
        state.parts = 0;
      }
      queue.clear();
      done.notify_all();
      return;
    }
    auto* r = static_cast<Request*>(io_uring_cqe_get_data(cqe));
    const int64_t result = cqe->res;
    io_uring_cqe_seen(&ring, cqe);
    std::lock_guard<std::mutex> lock(mu);
    if (!r) {   // the wake-up the destructor posts
      if (stop && inflight == 0 && queue.empty()) return;
      continue;
    }
    --inflight;
    if (auto rest = finished(*r, result)) queue.push_front(*rest);
    delete r;
    issue_queued();
    if (stop && inflight == 0 && queue.empty()) return;
  }
}
#endif

OffloadFile::OffloadFile(const OffloadFileOptions& options, const std::string& what) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.what = what;
  m.options = options;
  m.options.queue_depth = std::max(1, options.queue_depth);
  m.options.request_bytes = io_round_up(std::max<int64_t>(options.request_bytes, kIoAlign));
  if (m.options.max_transfer > 0) m.options.max_transfer = io_round_up(m.options.max_transfer);
}

OffloadFile::OffloadFile(const std::string& dir, int64_t bytes, const std::string& what, const OffloadFileOptions& options)
    : OffloadFile(options, what) {
  impl_->dir = dir;
  impl_->size = io_round_up(std::max<int64_t>(bytes, 1));
  impl_->open_file();
  start();
}

std::unique_ptr<OffloadFile> OffloadFile::open_for_reading(const std::string& path, const std::string& what,
                                                           const OffloadFileOptions& options) {
  std::unique_ptr<OffloadFile> f(new OffloadFile(options, what));
  f->impl_->open_existing(path);
  f->start();
  return f;
}

void OffloadFile::start() {
  Impl& m = *impl_;
  const OffloadFileOptions& options = m.options;
#ifdef COLOSSAL_HAVE_LIBURING
  // A kernel or sandbox without io_uring (ENOSYS, EPERM) gets the pread/pwrite thread instead.
  if (options.io_uring && io_uring_queue_init(static_cast<unsigned>(2 * m.options.queue_depth), &m.ring, 0) == 0) m.uring = true;
  if (m.uring) {
    m.thread = std::thread([&m] { m.run_uring(); });
    return;
  }
#endif
  m.thread = std::thread([&m] { m.run_sync(); });
}

OffloadFile::~OffloadFile() {
  Impl& m = *impl_;
  try {
    wait_all();
  } catch (const Error&) {   // a failed transfer nobody waited for: the run is ending anyway
  }
  {
    std::lock_guard<std::mutex> lock(m.mu);
    m.stop = true;
#ifdef COLOSSAL_HAVE_LIBURING
    if (m.uring) {
      io_uring_sqe* sqe = io_uring_get_sqe(&m.ring);
      io_uring_prep_nop(sqe);
      io_uring_sqe_set_data(sqe, nullptr);
      io_uring_submit(&m.ring);
    }
#endif
  }
  m.work.notify_all();
  if (m.thread.joinable()) m.thread.join();   // not when opening the file failed (a delegating constructor's body threw)
#ifdef COLOSSAL_HAVE_LIBURING
  if (m.uring) io_uring_queue_exit(&m.ring);
#endif
  if (m.fd >= 0) ::close(m.fd);
}

OffloadFile::Ticket OffloadFile::read(int64_t offset, void* buffer, int64_t bytes) {
  return impl_->post(false, offset, static_cast<char*>(buffer), bytes);
}

OffloadFile::Ticket OffloadFile::write(int64_t offset, const void* buffer, int64_t bytes) {
  return impl_->post(true, offset, static_cast<char*>(const_cast<void*>(buffer)), bytes);
}

void OffloadFile::wait(Ticket ticket) {
  Impl& m = *impl_;
  std::unique_lock<std::mutex> lock(m.mu);
  auto it = m.tickets.find(ticket);
  if (it == m.tickets.end()) return;   // waited for already
  m.done.wait(lock, [&] { return it->second.parts == 0; });
  const std::string error = it->second.error;
  m.tickets.erase(it);
  if (!error.empty()) throw Error(error);
}

void OffloadFile::wait_all() {
  std::vector<Ticket> all;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    for (const auto& [t, state] : impl_->tickets) all.push_back(t);
  }
  std::sort(all.begin(), all.end());
  std::optional<Error> first;   // every transfer is waited for, then the first failure is raised
  for (Ticket t : all) {
    try {
      wait(t);
    } catch (const Error& e) {
      if (!first) first = e;
    }
  }
  if (first) throw *first;
}

int64_t OffloadFile::size() const { return impl_->size; }
bool OffloadFile::direct() const { return impl_->direct; }
bool OffloadFile::io_uring() const { return impl_->uring; }
int64_t OffloadFile::bytes_read() const { return impl_->read_bytes; }
int64_t OffloadFile::bytes_written() const { return impl_->written_bytes; }

}  // namespace colossal::memory
