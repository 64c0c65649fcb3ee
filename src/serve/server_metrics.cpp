// Prometheus metrics of the server: see server_metrics.h.
#include "src/serve/server_metrics.h"

#include <sstream>

namespace colossal::serve {

void Histogram::observe(double s) {
  std::lock_guard lock(mutex_);
  size_t i = 0;
  while (i < kBounds.size() && s > kBounds[i]) ++i;
  ++counts_[i];
  sum_ += s;
}

std::string Histogram::render(const std::string& name, const std::string& help) const {
  std::lock_guard lock(mutex_);
  std::ostringstream o;
  o << "# HELP " << name << " " << help << "\n# TYPE " << name << " histogram\n";
  int64_t cumulative = 0;
  for (size_t i = 0; i < kBounds.size(); ++i) {
    cumulative += counts_[i];
    o << name << "_bucket{le=\"" << kBounds[i] << "\"} " << cumulative << "\n";
  }
  cumulative += counts_.back();
  o << name << "_bucket{le=\"+Inf\"} " << cumulative << "\n" << name << "_sum " << sum_ << "\n" << name << "_count " << cumulative << "\n";
  return o.str();
}

void ServerMetrics::request_done(int status) {
  std::lock_guard lock(mutex_);
  ++by_status_[status];
}

std::string ServerMetrics::render(const EngineStats& e) const {
  std::ostringstream o;
  o << "# HELP colossal_requests_total Completion requests answered, by HTTP status.\n# TYPE colossal_requests_total counter\n";
  {
    std::lock_guard lock(mutex_);
    for (const auto& [status, n] : by_status_) o << "colossal_requests_total{status=\"" << status << "\"} " << n << "\n";
  }
  auto gauge = [&](const char* name, const char* help, int64_t v, const char* type = "gauge") {
    o << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n" << name << " " << v << "\n";
  };
  gauge("colossal_requests_in_flight", "Completion requests being answered.", in_flight.load());
  gauge("colossal_generated_tokens_total", "Tokens generated.", e.tokens_generated, "counter");
  gauge("colossal_prompt_tokens_total", "Prompt tokens computed (recomputation after preemption included).", e.prompt_tokens, "counter");
  gauge("colossal_queue_length", "Sequences waiting to join the running batch.", e.waiting);
  gauge("colossal_running_sequences", "Sequences in the running batch.", e.running);
  gauge("colossal_batch_tokens", "Tokens in the last engine step.", e.last_step_tokens);
  gauge("colossal_batch_sequences", "Sequences in the last engine step.", e.last_step_sequences);
  gauge("colossal_kv_blocks_used", "KV cache blocks held by sequences.", e.blocks_used);
  gauge("colossal_kv_blocks_total", "KV cache blocks in the pool.", e.blocks_total);
  gauge("colossal_preemptions_total", "Sequences preempted for lack of KV blocks (recomputed later).", e.preemptions, "counter");
  gauge("colossal_engine_steps_total", "Engine steps (one forward each).", e.steps, "counter");
  o << request_seconds.render("colossal_request_seconds", "Time from a completion request's arrival to its last byte.");
  o << first_token_seconds.render("colossal_time_to_first_token_seconds", "Time from arrival to a choice's first token.");
  o << inter_token_seconds.render("colossal_inter_token_seconds", "Time between a choice's consecutive tokens.");
  return o.str();
}

}  // namespace colossal::serve
