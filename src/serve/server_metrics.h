// What /metrics reports, in Prometheus' text format: requests by outcome, tokens, the queue, the batch,
// KV blocks, and latency histograms (whole request, time to first token, time between tokens). Counters
// are updated from the request threads and the engine's; render() reads them with the engine's stats.
#pragma once
#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "src/serve/batch_engine.h"

namespace colossal::serve {

class Histogram {
 public:
  void observe(double seconds);
  std::string render(const std::string& name, const std::string& help) const;

 private:
  static constexpr std::array<double, 12> kBounds{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
  mutable std::mutex mutex_;
  std::array<int64_t, kBounds.size() + 1> counts_{};
  double sum_ = 0;
};

class ServerMetrics {
 public:
  void request_done(int status);                  // by HTTP status
  std::atomic<int64_t> in_flight{0};              // completion requests being answered
  Histogram request_seconds, first_token_seconds, inter_token_seconds;
  std::string render(const EngineStats& engine) const;

 private:
  mutable std::mutex mutex_;
  std::map<int, int64_t> by_status_;
};

}  // namespace colossal::serve
