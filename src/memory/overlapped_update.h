// OverlappedUpdate: one optimizer step's update on a thread of its own, beside the next forward.
//
// Under Gemini the update of host-resident chunks (or of states streamed from NVMe) takes a third or
// more of a step, and it need not hold up the next forward: the forward reads the chunks in a known
// order, so the update goes through them in that order and the forward waits, chunk by chunk, only for
// what is not done yet when it gets there. Every chunk's arithmetic is the same as in the plain update,
// so the weights are the same bits; what changes is only when each chunk's update happens.
//
// The thread runs `run`, which calls `done(chunk)` once a chunk's update (its parameters published,
// its gradients zeroed) is complete. An exception there ends the run: waiting for any chunk, or for
// the whole run, then rethrows it on the waiting thread.
#pragma once
#include <c10/core/Device.h>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace colossal::memory {

class OverlappedUpdate {
 public:
  using Done = std::function<void(int64_t chunk)>;
  OverlappedUpdate() = default;
  ~OverlappedUpdate();   // waits for a run still going (its error, if any, is dropped)
  OverlappedUpdate(const OverlappedUpdate&) = delete;
  OverlappedUpdate& operator=(const OverlappedUpdate&) = delete;

  // Starts `run` on a new thread for the chunks in `pending` (of `chunks`; the others count as done),
  // computing without recording gradients, with `threads` OpenMP threads and, on an accelerator, on
  // the caller's current stream of `device` (so its kernels queue in order with the forward's). The
  // last run must be finished.
  void start(int64_t chunks, const std::vector<int64_t>& pending, c10::Device device, int threads, std::function<void(const Done&)> run);
  bool done(int64_t chunk);   // without waiting (true while no run is going)
  void wait(int64_t chunk);   // until chunk's update is done (nothing while no run is going)
  void finish();              // until the whole run is done; joins its thread
  // Seconds the callers of wait and finish spent waiting since the last call; the last run's own seconds.
  double take_waited();
  double last_run_s() const { return run_s_; }

 private:
  void rethrow_if_failed(std::unique_lock<std::mutex>& lock);
  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<char> done_;
  bool ended_ = false;
  std::exception_ptr error_;
  double waited_ = 0, run_s_ = 0;
};

}  // namespace colossal::memory
