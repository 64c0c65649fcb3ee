// The NVMe tier: the offload file's transfers (io_uring and pread/pwrite, unaligned lengths, short
// transfers continued, many requests in flight), its errors for a bad directory, a file that leaves
// nothing behind, and the staging buffers the optimizer streams chunks through; and the memory a
// process may hold under a cgroup's limit, which decides whether streamed weights bypass the page cache.
#include <gtest/gtest.h>

#include <dirent.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <cstring>
#include <filesystem>
#include <random>

#include "src/core/device.h"
#include "src/core/error.h"
#include "src/memory/offload_file.h"
#include "src/memory/offloaded_states.h"
#include "tests/support/test_support.h"

using namespace colossal;
using namespace colossal::memory;
using colossal::test::TempDir;

namespace {

void fill(AlignedBuffer& b, int64_t bytes, uint32_t seed) {
  std::mt19937 rng(seed);
  for (int64_t i = 0; i < bytes; ++i) b.data()[i] = static_cast<char>(rng());
}

int entries(const std::string& dir) {
  int n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) ++n;
  return n;
}

// Writes regions of awkward lengths, all in flight at once, reads them back into fresh buffers, and
// checks every byte.
void round_trip(const OffloadFileOptions& options) {
  TempDir dir;
  const std::vector<int64_t> lengths = {4000, 1, 12345, 3 * 1048576 + 7, 4096, 65536};
  std::vector<int64_t> offsets;
  int64_t total = 0;
  for (int64_t n : lengths) {
    offsets.push_back(total);
    total += io_round_up(n);
  }
  OffloadFile f(dir.path(), total, "test file", options);
  if (options.io_uring && !f.io_uring()) GTEST_SKIP() << "this kernel refuses io_uring; the pread/pwrite case covers the path";
  EXPECT_EQ(f.size(), total);
  std::vector<AlignedBuffer> out, in;
  std::vector<OffloadFile::Ticket> tickets;
  for (size_t i = 0; i < lengths.size(); ++i) {
    out.emplace_back(lengths[i]);
    fill(out.back(), lengths[i], static_cast<uint32_t>(i + 1));
    tickets.push_back(f.write(offsets[i], out.back().data(), lengths[i]));
  }
  for (auto t : tickets) f.wait(t);
  tickets.clear();
  for (size_t i = 0; i < lengths.size(); ++i) {
    in.emplace_back(lengths[i]);
    tickets.push_back(f.read(offsets[i], in.back().data(), lengths[i]));
  }
  for (size_t i = lengths.size(); i-- > 0;) f.wait(tickets[i]);   // out of order
  for (size_t i = 0; i < lengths.size(); ++i)
    EXPECT_EQ(std::memcmp(in[i].data(), out[i].data(), static_cast<size_t>(lengths[i])), 0) << "region " << i << " of " << lengths[i] << " bytes";
  EXPECT_EQ(f.bytes_written(), total);
  EXPECT_EQ(f.bytes_read(), total);
}

}  // namespace

TEST(OffloadFile, UnalignedRegionsRoundTripWithManyRequestsInFlightThroughIoUring) {
  round_trip({.queue_depth = 3, .request_bytes = 8192, .io_uring = true});
}

TEST(OffloadFile, UnalignedRegionsRoundTripThroughPreadAndPwrite) {
  round_trip({.queue_depth = 3, .request_bytes = 8192, .io_uring = false});
}

TEST(OffloadFile, ShortTransfersAreContinuedUntilTheRegionIsComplete) {
  // Every system call moves at most 4 KiB of a 64 KiB request, as a device returning short reads would.
  round_trip({.queue_depth = 2, .request_bytes = 65536, .io_uring = true, .max_transfer = 4096});
  round_trip({.queue_depth = 2, .request_bytes = 65536, .io_uring = false, .max_transfer = 4096});
}

TEST(OffloadFile, TheFileHasNoNameSoNothingIsLeftBehind) {
  TempDir dir;
  {
    OffloadFile f(dir.path(), 1 << 20, "test file");
    EXPECT_EQ(entries(dir.path()), 0);   // O_TMPFILE or unlinked at once: gone with the process, even killed
    AlignedBuffer b(100);
    f.wait(f.write(0, b.data(), 100));
    EXPECT_EQ(entries(dir.path()), 0);
  }
  EXPECT_EQ(entries(dir.path()), 0);
}

TEST(OffloadFile, ABadDirectoryOrTooLittleSpaceIsOneLineErrorNamingIt) {
  TempDir dir;
  auto message = [&](const std::string& path, int64_t bytes) -> std::string {
    try {
      OffloadFile f(path, bytes, "nvme_path " + path);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  const std::string missing = dir / "nope";
  EXPECT_NE(message(missing, 4096).find("nvme_path " + missing + ": " + missing + " does not exist"), std::string::npos) << message(missing, 4096);
  colossal::test::write_file(dir / "a_file", "x");
  EXPECT_NE(message(dir / "a_file", 4096).find("is not a directory"), std::string::npos);
  const std::string huge = message(dir.path(), int64_t{1} << 50);
  EXPECT_NE(huge.find("the offload needs 1024.00 TiB in " + dir.path()), std::string::npos) << huge;
  EXPECT_NE(huge.find("free"), std::string::npos) << huge;
  for (const auto& m : {message(missing, 4096), huge}) EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  EXPECT_EQ(entries(dir.path()), 1);   // the failed attempts left nothing beside a_file
}

TEST(OffloadFile, TransfersUnalignedOrPastTheEndAreRefused) {
  TempDir dir;
  OffloadFile f(dir.path(), 8192, "test file");
  AlignedBuffer b(8192);
  EXPECT_THROW(f.read(100, b.data(), 10), Error);          // offset not aligned
  EXPECT_THROW(f.read(0, b.data() + 8, 10), Error);        // buffer not aligned
  EXPECT_THROW(f.write(4096, b.data(), 4097), Error);      // rounds up past the end
  f.wait(f.write(4096, b.data(), 4096));
}

TEST(OffloadFile, AnExistingFileIsReadInPlaceUpToItsEndShortReadsIncludedAndNeverWritten) {
  TempDir dir;
  // A file whose length is no multiple of the alignment, as a checkpoint's is: reads at aligned offsets
  // whose rounded length runs past its end give every byte that is there.
  const int64_t length = 3 * 1048576 + 12345;
  std::string bytes(static_cast<size_t>(length), '\0');
  std::mt19937 rng(7);
  for (auto& c : bytes) c = static_cast<char>(rng());
  colossal::test::write_file(dir / "model.safetensors", bytes);
  for (const bool uring : {true, false})
    for (const bool direct : {true, false})
      for (const int64_t cap : {int64_t{0}, int64_t{4096}}) {
        const std::string how = std::string(uring ? "io_uring" : "pread") + (direct ? ", O_DIRECT" : "") + (cap ? ", 4 KiB a call" : "");
        auto f = OffloadFile::open_for_reading(dir / "model.safetensors", "checkpoint file",
                                               {.queue_depth = 3, .request_bytes = 65536, .io_uring = uring, .direct = direct, .max_transfer = cap});
        EXPECT_EQ(f->size(), length) << how;
        for (const int64_t offset : {int64_t{0}, int64_t{1048576}, length / 4096 * 4096}) {
          const int64_t n = length - offset;   // to the end: its last request comes back short
          AlignedBuffer b(n);
          f->wait(f->read(offset, b.data(), n));
          EXPECT_EQ(std::memcmp(b.data(), bytes.data() + offset, static_cast<size_t>(n)), 0) << how << " from " << offset;
        }
        AlignedBuffer b(4096);
        EXPECT_THROW(f->write(0, b.data(), 4096), Error) << how;
        EXPECT_THROW(f->read(io_round_up(length), b.data(), 4096), Error) << how;   // wholly past the end
      }
  try {
    OffloadFile::open_for_reading(dir / "missing.safetensors", "checkpoint file " + (dir / "missing.safetensors"));
    ADD_FAILURE() << "a missing file opened";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("checkpoint file " + (dir / "missing.safetensors") + ": cannot open"), std::string::npos) << e.what();
  }
}

TEST(OffloadedStates, ChunksStreamedThroughThreeBuffersKeepEveryValueAndStartAtZero) {
  TempDir dir;
  // Seven chunks of uneven lengths, two states each: more chunks than staging buffers, so every pass
  // evicts, writes back and reads again.
  const std::vector<int64_t> numels = {1000, 4096, 17, 30000, 1, 5000, 1024};
  OffloadedStates s(numels, 2, at::kFloat, dir.path(), "test states", 0, 3, {.queue_depth = 4, .request_bytes = 16384});
  ASSERT_EQ(s.slices(), s.chunks());   // whole chunks
  for (int64_t c = 0; c < s.chunks(); ++c) {
    const auto& st = s.acquire(c, false);
    ASSERT_EQ(st.size(), 2u);
    EXPECT_EQ(st[0].numel(), numels[static_cast<size_t>(c)]);
    EXPECT_TRUE(at::all(st[0] == 0).item<bool>() && at::all(st[1] == 0).item<bool>()) << "chunk " << c << " starts at zero";
  }
  // Three passes as the optimizer makes them: prefetch the next chunk, change this one, write it back.
  for (int pass = 0; pass < 3; ++pass) {
    s.prefetch(0);
    for (int64_t c = 0; c < s.chunks(); ++c) {
      s.prefetch(c + 1);
      const auto& st = s.acquire(c, true);
      st[0].add_(static_cast<double>(c + 1));
      st[1].add_(at::arange(st[1].numel(), st[1].options()));
      s.writeback(c);
    }
  }
  // A change left in its buffer (no writeback) reaches the file when the buffer is taken for another chunk.
  s.acquire(3, true)[0].add_(1000.0);
  for (int64_t c : {6, 2, 5, 0, 4, 1, 3}) {   // out of order: reads, evictions and write-backs mixed
    const auto& st = s.acquire(c, false);
    const double first = 3.0 * static_cast<double>(c + 1) + (c == 3 ? 1000.0 : 0.0);
    EXPECT_TRUE(at::all(st[0] == first).item<bool>()) << "chunk " << c;
    EXPECT_TRUE(at::equal(st[1], at::arange(st[1].numel(), st[1].options()) * 3)) << "chunk " << c;
  }
  s.flush();
  EXPECT_EQ(s.staged_bytes(), 3 * 2 * io_round_up(30000 * 4));   // three buffers of the largest chunk's two states
  EXPECT_GE(s.file_bytes(), 2 * 4 * (1000 + 4096 + 17 + 30000 + 1 + 5000 + 1024));
}

TEST(OffloadedStates, SlicesCutEveryChunkAndRangesAcrossThemReadAndWriteThrough) {
  TempDir dir;
  // Slices of at most 1000 elements: chunk 1 (4096) is five slices, chunk 3 (30000) thirty.
  const std::vector<int64_t> numels = {1000, 4096, 17, 30000};
  OffloadedStates s(numels, 3, at::kFloat, dir.path(), "test states", 1000, 3);
  EXPECT_EQ(s.slices(), 1 + 5 + 1 + 30);
  EXPECT_EQ(s.first_slice(1), 1);
  EXPECT_EQ(s.first_slice(2), 6);
  EXPECT_EQ(s.slice(5).begin, 4000);
  EXPECT_EQ(s.slice(5).numel, 96);
  EXPECT_EQ(s.staged_bytes(), 3 * 3 * io_round_up(1000 * 4));   // three slices, not three of the largest chunk
  // A range straddling slices goes in and comes back, and lands in the slices it spans.
  const auto values = at::arange(2500, at::kFloat);
  s.write(3, 2, 1700, values);
  auto back = at::empty({2500});
  s.read(3, 2, 1700, back);
  EXPECT_TRUE(at::equal(back, values));
  const auto& third = s.acquire(s.first_slice(3) + 2, false);   // chunk 3's elements [2000, 3000)
  EXPECT_TRUE(at::equal(third[2], at::arange(300, 1300, at::kFloat)));
  EXPECT_TRUE(at::all(third[0] == 0).item<bool>());
  // Everything survives eviction: read the whole chunk after touching all the others.
  for (int64_t u = 0; u < s.slices(); ++u) s.acquire(u, true)[1].add_(1.0);
  auto whole = at::empty({30000});
  s.read(3, 2, 0, whole);
  EXPECT_TRUE(at::equal(whole.narrow(0, 1700, 2500), values));
  EXPECT_EQ(whole.narrow(0, 0, 1700).abs().sum().item<double>(), 0.0);
  s.read(3, 1, 0, whole);
  EXPECT_TRUE(at::all(whole == 1).item<bool>());
  EXPECT_THROW(s.read(0, 0, 900, whole), Error);   // past chunk 0's 1000 elements
}

TEST(UsableMemory, IsTheMachinesOrTheTighterLimitOfTheProcessesMemoryCgroup) {
  const size_t physical = physical_memory_bytes(), usable = usable_memory_bytes();
  EXPECT_GT(usable, size_t{0});
  EXPECT_LE(usable, physical);
  // A child moved into a new memory cgroup of 3 GiB (v2 where mounted with the memory controller, else
  // v1) sees that limit.
  std::string dir, limit_file;
  if (std::filesystem::exists("/sys/fs/cgroup/cgroup.controllers")) {
    dir = "/sys/fs/cgroup/colossal_usable_test." + std::to_string(getpid());
    limit_file = "memory.max";
  } else if (std::filesystem::exists("/sys/fs/cgroup/memory")) {
    dir = "/sys/fs/cgroup/memory/colossal_usable_test." + std::to_string(getpid());
    limit_file = "memory.limit_in_bytes";
  }
  if (dir.empty() || geteuid() != 0 || mkdir(dir.c_str(), 0755) != 0)
    GTEST_SKIP() << "no memory cgroup this test may create (needs root and a mounted memory controller)";
  const size_t three = size_t{3} << 30;
  colossal::test::write_file(dir + "/" + limit_file, std::to_string(three));
  int pipe_fd[2];
  ASSERT_EQ(pipe(pipe_fd), 0);
  const pid_t child = fork();
  if (child == 0) {   // writes its own pid into the cgroup, then what it may hold
    FILE* procs = std::fopen((dir + "/cgroup.procs").c_str(), "w");
    const bool moved = procs && std::fprintf(procs, "%d\n", getpid()) > 0 && std::fclose(procs) == 0;
    const size_t seen = moved ? usable_memory_bytes() : 0;
    _exit(write(pipe_fd[1], &seen, sizeof seen) == sizeof seen ? 0 : 1);
  }
  size_t seen = 0;
  const bool got = read(pipe_fd[0], &seen, sizeof seen) == sizeof seen;
  int status = 0;
  waitpid(child, &status, 0);
  close(pipe_fd[0]);
  close(pipe_fd[1]);
  rmdir(dir.c_str());
  ASSERT_TRUE(got);
  EXPECT_EQ(seen, std::min(three, physical));
}
