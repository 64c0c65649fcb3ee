// Progress: the one live line of a long job (step, loss, lr, tokens/s, ETA, memory). On a terminal
// it redraws in place; otherwise it is logged every `every` updates so log files stay readable.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>

namespace colossal {

class Progress {
 public:
  Progress(int64_t total_steps, int64_t every, bool enabled);
  ~Progress();
  void update(int64_t step, double loss, double lr, double tokens_per_s, double eta_s, size_t mem_bytes);
  void finish();   // leaves the last line in place and stops redrawing

 private:
  int64_t total_, every_;
  bool enabled_, active_ = false;
};

}  // namespace colossal
