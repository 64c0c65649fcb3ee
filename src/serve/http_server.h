// CompletionServer: `colossal serve`'s HTTP side (Debian's cpp-httplib) over a BatchEngine, speaking
// OpenAI's completions API as its client libraries use it:
//   POST /v1/completions   completion_api.h's request; a JSON response, or with "stream": true
//                          server-sent events (one chunk per piece of text, then "data: [DONE]")
//   GET  /v1/models        the one model served
//   GET  /health           {"status": "ok"} (503 while shutting down)
//   GET  /metrics          Prometheus text (server_metrics.h)
//   GET  /                 a page where a person types a prompt and watches it stream (web_page.h)
// With an API key, /v1/* and /metrics need "Authorization: Bearer KEY". Bodies, max_tokens, choices per
// request, requests at once and the engine's queue are bounded (413, 400, 503, 429, each with a reason in
// OpenAI's error shape); a client that goes away mid-stream has its sequences cancelled at once. The
// engine steps on a thread of its own whenever it has work.
#pragma once
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "src/data/tokenizer.h"
#include "src/serve/batch_engine.h"
#include "src/serve/completion_api.h"
#include "src/serve/server_metrics.h"

namespace httplib {
class Server;
struct Response;
}

namespace colossal::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                 // 0: any free port (bind() says which)
  std::string api_key;             // "": no authentication
  std::string model_name;          // what /v1/models lists and requests may name
  ServeLimits limits;
  int64_t max_concurrent = 64;     // completion requests answered at once; beyond, 503
  double shutdown_grace_s = 10;    // on shutdown, in-flight requests get this long before being cancelled
};

class CompletionServer {
 public:
  CompletionServer(BatchEngine& engine, const Tokenizer& tokenizer, ServerOptions options);
  ~CompletionServer();
  // Binds the address; Error naming it when it cannot. Returns the port (the chosen one for port 0).
  int bind();
  // Serves until shutdown(); the engine's thread runs meanwhile. Error when the engine failed (every
  // request in flight was answered with the failure first).
  void serve();
  // From any thread: new requests get 503, in-flight ones finish within the grace period (then are
  // cancelled, ending as "cancelled"), and serve() returns.
  void shutdown();

 private:
  struct Job;
  void install_routes();
  void engine_loop();
  void require_key(const std::string& authorization) const;   // ApiError 401 unless it carries the key (when one is set)
  void answer_completion(const std::string& body, const std::string& authorization, httplib::Response& res);
  std::shared_ptr<Job> start_job(const CompletionRequest& request);
  std::vector<std::shared_ptr<Job>> live_jobs();
  void fail_all(const std::string& reason);
  void wake_engine();

  BatchEngine& engine_;
  const Tokenizer& tokenizer_;
  ServerOptions options_;
  std::unique_ptr<httplib::Server> http_;
  ServerMetrics metrics_;
  std::atomic<bool> draining_{false}, stopping_{false};
  std::string engine_failure_;   // set by the engine's thread before it stops the server
  std::atomic<int64_t> next_job_{0};
  std::mutex engine_mutex_;
  std::condition_variable engine_cv_;
  bool engine_has_work_ = false;
  std::thread engine_thread_;
  std::mutex jobs_mutex_;
  std::condition_variable jobs_cv_;
  std::vector<std::weak_ptr<Job>> jobs_;   // in flight, for shutdown's cancellation
};

}  // namespace colossal::serve
