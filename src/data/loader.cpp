// WindowLoader: see loader.h.
#include "src/data/loader.h"

#include <ATen/ATen.h>
#include <numeric>

#include "src/core/error.h"

namespace colossal {
namespace {

// splitmix64: a tiny, well-mixed generator whose output is the same on every platform and library
// (std::shuffle's is not specified), so a seed means the same data order everywhere.
uint64_t splitmix(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

}  // namespace

WindowLoader::WindowLoader(std::shared_ptr<const std::vector<int32_t>> tokens, const LoaderConfig& config,
                           int64_t start_sample)
    : tokens_(std::move(tokens)), cfg_(config), start_(start_sample) {
  const int64_t n = static_cast<int64_t>(tokens_->size()), t = cfg_.seq_len;
  // Leave room for any shift in [0, t) so every epoch has the same number of windows.
  windows_ = n > t ? (n - t) / t : 0;
  if (windows_ < cfg_.batch_size * cfg_.world)
    throw Error("training split has " + std::to_string(n) + " tokens: too few for one batch of " +
                std::to_string(cfg_.batch_size) + " x " + std::to_string(t + 1) + " tokens per rank across " +
                std::to_string(cfg_.world) + " rank(s) (use more text, a smaller batch_size or seq_len)");
  worker_ = std::thread([this] { produce(); });
}

WindowLoader::~WindowLoader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

const std::vector<int64_t>& WindowLoader::epoch_order(int64_t epoch, uint64_t& shift) const {
  if (epoch != order_epoch_) {
    uint64_t state = cfg_.seed * 0x100000001B3ULL + static_cast<uint64_t>(epoch) + 1;
    order_.resize(windows_);
    std::iota(order_.begin(), order_.end(), 0);
    for (int64_t i = windows_ - 1; i > 0; --i) {   // Fisher-Yates
      int64_t j = static_cast<int64_t>(splitmix(state) % static_cast<uint64_t>(i + 1));
      std::swap(order_[i], order_[j]);
    }
    uint64_t shift_state = cfg_.seed ^ (0xA5A5A5A5ULL + static_cast<uint64_t>(epoch));
    order_shift_ = splitmix(shift_state) % static_cast<uint64_t>(cfg_.seq_len);
    order_epoch_ = epoch;
  }
  shift = order_shift_;
  return order_;
}

at::Tensor WindowLoader::batch(int64_t k) const {
  const int64_t b = cfg_.batch_size, t = cfg_.seq_len;
  at::Tensor out = at::empty({b, t + 1}, at::kLong);
  int64_t* dst = out.data_ptr<int64_t>();
  std::lock_guard<std::mutex> lock(order_mu_);   // the loader thread, or a direct caller
  for (int64_t j = 0; j < b; ++j) {
    const int64_t sample = start_ + (k * cfg_.world + cfg_.rank) * b + j;   // global index across epochs
    uint64_t shift = 0;
    const auto& order = epoch_order(sample / windows_, shift);
    const int64_t window = order[sample % windows_];
    const int32_t* src = tokens_->data() + shift + window * t;
    for (int64_t i = 0; i <= t; ++i) dst[j * (t + 1) + i] = src[i];
  }
  return out;
}

void WindowLoader::produce() {
  int64_t k = 0;
  try {
    while (true) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || static_cast<int64_t>(ready_.size()) < cfg_.prefetch; });
        if (stop_) return;
      }
      at::Tensor b = batch(k++);
      {
        std::lock_guard<std::mutex> lock(mu_);
        ready_.push_back(std::move(b));
      }
      cv_.notify_all();
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = std::current_exception();
    cv_.notify_all();
  }
}

at::Tensor WindowLoader::next() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !ready_.empty() || error_; });
  if (ready_.empty() && error_) std::rethrow_exception(error_);
  at::Tensor b = std::move(ready_.front());
  ready_.pop_front();
  ++consumed_;
  lock.unlock();
  cv_.notify_all();
  return b;
}

std::vector<at::Tensor> eval_batches(const std::vector<int32_t>& tokens, int64_t batch_size, int64_t seq_len,
                                     int64_t max_batches, int64_t rank, int64_t world) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t windows = n > seq_len ? (n - 1) / seq_len : 0;
  const int64_t per_rank = windows / world;
  const int64_t batches = std::min(max_batches, per_rank / batch_size);
  std::vector<at::Tensor> out;
  for (int64_t k = 0; k < batches; ++k) {
    at::Tensor b = at::empty({batch_size, seq_len + 1}, at::kLong);
    int64_t* dst = b.data_ptr<int64_t>();
    for (int64_t j = 0; j < batch_size; ++j) {
      int64_t window = (k * batch_size + j) * world + rank;
      for (int64_t i = 0; i <= seq_len; ++i) dst[j * (seq_len + 1) + i] = tokens[window * seq_len + i];
    }
    out.push_back(b);
  }
  return out;
}

}  // namespace colossal
