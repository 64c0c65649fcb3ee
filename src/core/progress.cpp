// Progress line: see progress.h.
#include "src/core/progress.h"

#include <cstdio>
#include <spdlog/spdlog.h>

#include "src/core/log.h"
#include "src/core/text.h"

namespace colossal {

Progress::Progress(int64_t total_steps, int64_t every, bool enabled)
    : total_(total_steps), every_(std::max<int64_t>(1, every)), enabled_(enabled) {}

Progress::~Progress() { finish(); }

void Progress::update(int64_t step, double loss, double lr, double tokens_per_s, double eta_s, size_t mem_bytes) {
  if (!enabled_) return;
  char buf[256];
  std::snprintf(buf, sizeof buf, "step %lld/%lld | loss %.4f | lr %.2e | %s tok/s | ETA %s | mem %s",
                static_cast<long long>(step), static_cast<long long>(total_), loss, lr,
                human_count(tokens_per_s).c_str(), human_duration(eta_s).c_str(),
                human_bytes(static_cast<double>(mem_bytes)).c_str());
  if (stderr_is_terminal()) {
    set_progress_line(buf);
    active_ = true;
  } else if (step % every_ == 0 || step == total_) {
    spdlog::info("{}", buf);
  }
}

void Progress::finish() {
  if (!active_) return;
  set_progress_line("");   // clears the line; the next message starts clean
  active_ = false;
}

}  // namespace colossal
