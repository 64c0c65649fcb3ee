// WindowLoader: fixed-length training windows sampled deterministically from a seed, sharded by
// data-parallel rank, prepared ahead on a background thread.
//
// Each epoch cuts the token stream into windows of seq_len+1 tokens at a seed-dependent shift and
// visits them in a seed-dependent permutation, reshuffled every epoch; the epochs form one global
// stream of samples. A global batch is the next B x W samples of that stream and rank r of W takes
// samples [r*B, (r+1)*B) of it, so the W ranks together see exactly what one process with batch B x W
// sees. The position is counted in global samples: a loader restarted there continues exactly where an
// uninterrupted one would be (resume is bit-identical), whatever the number of ranks before and after.
#pragma once
#include <ATen/core/Tensor.h>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace colossal {

struct LoaderConfig {
  int64_t batch_size = 8;
  int64_t seq_len = 128;
  uint64_t seed = 0;
  int64_t rank = 0;
  int64_t world = 1;
  int64_t prefetch = 4;   // batches kept ready
};

class WindowLoader {
 public:
  // Error if the tokens cannot fill one global batch. `start_sample`: global samples already consumed.
  WindowLoader(std::shared_ptr<const std::vector<int32_t>> tokens, const LoaderConfig& config, int64_t start_sample = 0);
  ~WindowLoader();
  WindowLoader(const WindowLoader&) = delete;
  WindowLoader& operator=(const WindowLoader&) = delete;

  at::Tensor next();                       // [B, T+1] int64 (inputs = [:, :-1], targets = [:, 1:])
  // Global samples consumed so far (all ranks' batches handed out, plus the start).
  int64_t position() const { return start_ + consumed_ * cfg_.batch_size * cfg_.world; }
  int64_t windows_per_epoch() const { return windows_; }
  at::Tensor batch(int64_t k) const;       // this rank's k-th batch from the start, computed directly

 private:
  void produce();
  // Window indices of `epoch` in visiting order and the epoch's shift, computed once per epoch (an
  // O(windows) shuffle) and kept while batches of that epoch are cut.
  const std::vector<int64_t>& epoch_order(int64_t epoch, uint64_t& shift) const;

  std::shared_ptr<const std::vector<int32_t>> tokens_;
  LoaderConfig cfg_;
  int64_t windows_ = 0;
  int64_t start_ = 0;      // global sample the loader started at
  int64_t consumed_ = 0;   // batches handed out by next()

  mutable std::mutex order_mu_;
  mutable int64_t order_epoch_ = -1;
  mutable uint64_t order_shift_ = 0;
  mutable std::vector<int64_t> order_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<at::Tensor> ready_;
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread worker_;
};

// Evaluation windows: consecutive, non-overlapping windows of the held-out split, rank-sharded, the
// same every time (so eval losses are comparable across steps and runs). Up to `max_batches`.
std::vector<at::Tensor> eval_batches(const std::vector<int32_t>& tokens, int64_t batch_size, int64_t seq_len,
                                     int64_t max_batches, int64_t rank = 0, int64_t world = 1);

}  // namespace colossal
