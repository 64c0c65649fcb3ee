// See overlapped_update.h.
#include "src/memory/overlapped_update.h"

#include <ATen/core/grad_mode.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <chrono>
#include <optional>
#include <utility>

#include "kernels/cpu/threads.h"
#include "src/core/error.h"

namespace colossal::memory {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
}  // namespace

OverlappedUpdate::~OverlappedUpdate() {
  if (thread_.joinable()) thread_.join();
}

void OverlappedUpdate::start(int64_t chunks, const std::vector<int64_t>& pending, c10::Device device, int threads,
                             std::function<void(const Done&)> run) {
  if (thread_.joinable()) throw Error("overlapped update: the last step's update is still running (internal)");
  done_.assign(static_cast<size_t>(chunks), 1);
  for (int64_t c : pending) done_[static_cast<size_t>(c)] = 0;
  ended_ = false;
  error_ = nullptr;
  std::optional<c10::Stream> stream;   // the forward's stream: the update's kernels queue before its next ones
  if (!device.is_cpu()) stream = c10::impl::VirtualGuardImpl(device.type()).getStream(device);
  thread_ = std::thread([this, threads, stream, run = std::move(run)] {
    const auto t0 = Clock::now();
    std::optional<c10::StreamGuard> on_stream;
    if (stream) on_stream.emplace(*stream);
    at::NoGradGuard no_grad;
    kernels::set_threads_of_this_thread(threads);
    std::exception_ptr error;
    try {
      run([this](int64_t chunk) {
        const std::lock_guard<std::mutex> lock(mutex_);
        done_[static_cast<size_t>(chunk)] = 1;
        changed_.notify_all();
      });
    } catch (...) {
      error = std::current_exception();
    }
    const std::lock_guard<std::mutex> lock(mutex_);
    error_ = error;
    ended_ = true;
    run_s_ = seconds_since(t0);
    changed_.notify_all();
  });
}

void OverlappedUpdate::rethrow_if_failed(std::unique_lock<std::mutex>& lock) {
  if (!ended_ || !error_) return;
  lock.unlock();
  thread_.join();
  std::exception_ptr error = std::exchange(error_, nullptr);
  std::rethrow_exception(error);
}

bool OverlappedUpdate::done(int64_t chunk) {
  if (!thread_.joinable()) return true;
  const std::lock_guard<std::mutex> lock(mutex_);
  return done_[static_cast<size_t>(chunk)] != 0;
}

void OverlappedUpdate::wait(int64_t chunk) {
  if (!thread_.joinable()) return;
  std::unique_lock<std::mutex> lock(mutex_);
  const auto k = static_cast<size_t>(chunk);
  if (!done_[k]) {
    const auto t0 = Clock::now();
    changed_.wait(lock, [&] { return done_[k] || ended_; });
    waited_ += seconds_since(t0);
  }
  rethrow_if_failed(lock);
  if (!done_[k]) throw Error("overlapped update: chunk " + std::to_string(chunk) + " was never updated (internal)");
}

void OverlappedUpdate::finish() {
  if (!thread_.joinable()) return;
  std::unique_lock<std::mutex> lock(mutex_);
  const auto t0 = Clock::now();
  changed_.wait(lock, [&] { return ended_; });
  waited_ += seconds_since(t0);
  rethrow_if_failed(lock);
  lock.unlock();
  thread_.join();
}

double OverlappedUpdate::take_waited() {
  const std::lock_guard<std::mutex> lock(mutex_);
  return std::exchange(waited_, 0.0);
}

}  // namespace colossal::memory
