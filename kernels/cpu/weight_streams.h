// How many weight rows a decoding GEMV reads at once on each core, each from its own place in memory.
// Decoding reads every weight once a step, so its speed is the rate one core can stream memory, and the
// two vendors differ in what gets there. On an Intel Xeon (family 6 model 207, 2 cores) one sequential
// stream a core reached 20 GB/s where MKL's sgemv reached 27: a core's L2 streamer runs ahead on each
// 4 KiB page it sees being read, and one stream gives it one page at a time. Four rows from four
// stretches of the weight, with a software prefetch 2 KiB ahead in each, read at 29 GB/s (the 124M
// shape's layers, 2 threads, a throwaway harness). Four neighbouring rows (one page) did not: 25. On
// AMD EPYCs (Zen 3, Zen 4) the opposite held: one stream a core was the fastest (34 GB/s on a Zen 4
// against 25-29 with four rows interleaved), so AMD and unknown vendors keep one.
#pragma once

namespace colossal::kernels {

// 1 to 4: COLOSSAL_WEIGHT_STREAMS where set (read once; anything else there is an error naming the
// variable), else 4 on Intel and 1 elsewhere. A ScopedWeightStreams in force wins over both.
int weight_streams();

// Whether the GEMV prefetches ahead of a stream read by one or two x rows (gemv_isa.cpp): on AMD's
// family 26 (Zen 5) and later, where it made the stream faster, and nowhere else (a Zen 3's was slower).
bool prefetch_one_row();

// What COLOSSAL_WEIGHT_STREAMS=`value` means: the count, or std::invalid_argument. Null or empty: the
// vendor's default.
int weight_streams_from(const char* value);

// While alive, the GEMVs read `streams` rows at once (1 to 4). Not thread-safe: for tests and
// benchmarks comparing layouts in one process. Every layout gives the same bits.
class ScopedWeightStreams {
 public:
  explicit ScopedWeightStreams(int streams);
  ~ScopedWeightStreams();
  ScopedWeightStreams(const ScopedWeightStreams&) = delete;
  ScopedWeightStreams& operator=(const ScopedWeightStreams&) = delete;

 private:
  int previous_;
};

}  // namespace colossal::kernels
