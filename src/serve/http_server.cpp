// The completions server: see http_server.h.
#include "src/serve/http_server.h"

#include <httplib.h>

#include <chrono>
#include <deque>
#include <random>
#include <spdlog/spdlog.h>

#include "src/core/error.h"
#include "src/serve/web_page.h"

namespace colossal::serve {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

void send_json(httplib::Response& res, int status, const nlohmann::json& body) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n", "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) {
  send_json(res, e.status, error_body(e));
  if (e.status == 429 || e.status == 503) res.set_header("Retry-After", "1");
}

std::string sse(const nlohmann::json& j) { return "data: " + j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n\n"; }

}  // namespace

// One completion request in flight: its choices as the engine fills them (engine thread) and, when
// streaming, the events waiting to be written (request thread).
struct CompletionServer::Job {
  struct Choice {
    int64_t engine_id = -1;
    std::string prefix;            // the prompt's text when echoing
    std::string text, finish_reason;
    int64_t prompt_tokens = 0, completion_tokens = 0;
    ChoiceLogprobs logprobs, unsent_logprobs;
    bool done = false;
    Clock::time_point last_token;
  };
  std::mutex m;
  std::condition_variable cv;
  std::vector<Choice> choices;
  std::deque<std::string> events;
  int64_t remaining = 0;
  CompletionRequest request;
  std::string id, model;
  int64_t created = 0;
  Clock::time_point start = Clock::now();

  nlohmann::json chunk(size_t index, const std::string& text, const nlohmann::json& logprobs, const nlohmann::json& finish) const {
    return {{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", model},
            {"choices", {{{"text", text}, {"index", index}, {"logprobs", logprobs}, {"finish_reason", finish}}}}};
  }
  nlohmann::json usage() const {
    int64_t prompt = 0, completion = 0;
    for (size_t i = 0; i < choices.size(); ++i) {
      if (i % static_cast<size_t>(request.n) == 0) prompt += choices[i].prompt_tokens;   // each prompt once, whatever n
      completion += choices[i].completion_tokens;
    }
    return {{"prompt_tokens", prompt}, {"completion_tokens", completion}, {"total_tokens", prompt + completion}};
  }
};

CompletionServer::CompletionServer(BatchEngine& engine, const Tokenizer& tokenizer, ServerOptions options)
    : engine_(engine), tokenizer_(tokenizer), options_(std::move(options)), http_(std::make_unique<httplib::Server>()) {
  const size_t threads = static_cast<size_t>(std::max<int64_t>(options_.max_concurrent, 1)) + 8;
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http_->set_payload_max_length(static_cast<size_t>(options_.limits.max_body_bytes));
  install_routes();
}

CompletionServer::~CompletionServer() {
  stopping_ = true;
  wake_engine();
  if (engine_thread_.joinable()) engine_thread_.join();
}

int CompletionServer::bind() {
  const int port = options_.port == 0 ? http_->bind_to_any_port(options_.host) : (http_->bind_to_port(options_.host, options_.port) ? options_.port : -1);
  if (port < 0)
    throw Error("cannot listen on " + options_.host + ":" + std::to_string(options_.port) +
                " (in use, or not an address of this machine; --port 0 picks a free port)");
  return port;
}

void CompletionServer::wake_engine() {
  {
    std::lock_guard lock(engine_mutex_);
    engine_has_work_ = true;
  }
  engine_cv_.notify_one();
}

void CompletionServer::engine_loop() {
  while (!stopping_) {
    bool worked = false;
    try {
      worked = engine_.step();
    } catch (const std::exception& e) {   // an engine failure ends the server rather than hanging every client
      engine_failure_ = e.what();
      draining_ = true;
      fail_all(std::string("the engine failed: ") + e.what());
      http_->stop();
      return;
    }
    if (worked) continue;
    std::unique_lock lock(engine_mutex_);
    engine_cv_.wait_for(lock, std::chrono::milliseconds(50), [&] { return engine_has_work_ || stopping_.load(); });
    engine_has_work_ = false;
  }
}

void CompletionServer::serve() {
  engine_thread_ = std::thread([this] { engine_loop(); });
  http_->listen_after_bind();
  stopping_ = true;
  wake_engine();
  engine_thread_.join();
  if (!engine_failure_.empty()) throw Error("serve: the engine failed: " + engine_failure_);
}

std::vector<std::shared_ptr<CompletionServer::Job>> CompletionServer::live_jobs() {
  std::vector<std::shared_ptr<Job>> live;
  std::lock_guard lock(jobs_mutex_);
  for (auto& w : jobs_)
    if (auto j = w.lock()) live.push_back(j);
  return live;
}

// Every request in flight ends now with `reason` (an error event for streams, finish_reason "error").
void CompletionServer::fail_all(const std::string& reason) {
  for (auto& j : live_jobs()) {
    std::lock_guard lock(j->m);
    for (size_t i = 0; i < j->choices.size(); ++i) {
      auto& c = j->choices[i];
      if (c.done) continue;
      c.done = true;
      c.finish_reason = "error";
      --j->remaining;
    }
    if (j->request.stream) j->events.push_back(sse(error_body(ApiError(500, reason, "", "server_error"))));
    j->cv.notify_all();
  }
}

void CompletionServer::shutdown() {
  if (draining_.exchange(true)) return;
  spdlog::info("serve: shutting down: {} request(s) in flight get {:.0f} s to finish", metrics_.in_flight.load(), options_.shutdown_grace_s);
  auto wait_for_in_flight = [&](double seconds) {
    std::unique_lock lock(jobs_mutex_);
    return jobs_cv_.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return metrics_.in_flight.load() == 0; });
  };
  if (!wait_for_in_flight(options_.shutdown_grace_s)) {
    const auto live = live_jobs();
    spdlog::info("serve: cancelling {} request(s) still running", live.size());
    for (auto& j : live) {
      std::lock_guard lock(j->m);
      for (auto& c : j->choices)
        if (!c.done && c.engine_id >= 0) engine_.cancel(c.engine_id);
    }
    wake_engine();
    wait_for_in_flight(10.0);
  }
  http_->stop();
}

std::shared_ptr<CompletionServer::Job> CompletionServer::start_job(const CompletionRequest& r) {
  auto job = std::make_shared<Job>();
  job->request = r;
  job->id = "cmpl-" + std::to_string(next_job_++);
  job->model = options_.model_name;
  job->created = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  const int64_t context = engine_.context_length();
  std::vector<std::vector<int>> prompts;
  for (size_t p = 0; p < r.prompt_count(); ++p) {
    std::vector<int> ids = r.prompts.empty() ? r.prompt_ids[p] : tokenizer_.encode(r.prompts[p], /*add_special=*/true);
    if (ids.empty()) {
      if (!tokenizer_.end_of_text()) throw ApiError(400, "prompt " + std::to_string(p) + " is empty", "prompt");
      ids.push_back(*tokenizer_.end_of_text());   // an empty prompt starts a fresh document
    }
    const int64_t want = static_cast<int64_t>(ids.size()) + r.max_tokens;
    if (want > context)
      throw ApiError(400, "This model's maximum context length is " + std::to_string(context) + " tokens, however you requested " +
                              std::to_string(want) + " tokens (" + std::to_string(ids.size()) + " in your prompt; " +
                              std::to_string(r.max_tokens) + " for the completion). Please reduce your prompt; or completion length.",
                     "prompt", "invalid_request_error", "context_length_exceeded");
    prompts.push_back(std::move(ids));
  }
  const int64_t queued = engine_.stats().waiting;
  if (queued + static_cast<int64_t>(prompts.size()) * r.n > options_.limits.max_queue)
    throw ApiError(429, "the queue is full (" + std::to_string(queued) + " sequences waiting, at most " +
                            std::to_string(options_.limits.max_queue) + "); retry shortly",
                   "", "rate_limit_error", "queue_full");
  const uint64_t seed = r.seed.value_or(std::random_device{}());
  job->choices.resize(prompts.size() * static_cast<size_t>(r.n));
  job->remaining = static_cast<int64_t>(job->choices.size());
  std::vector<int64_t> submitted;
  try {
    for (size_t i = 0; i < job->choices.size(); ++i) {
      const auto& ids = prompts[i / static_cast<size_t>(r.n)];
      auto& choice = job->choices[i];
      if (r.echo) choice.prefix = r.prompts.empty() ? tokenizer_.decode(ids, true) : r.prompts[i / static_cast<size_t>(r.n)];
      EngineRequest e;
      e.prompt = ids;
      e.sampling.greedy = r.temperature == 0.0;
      e.sampling.temperature = r.temperature;
      e.sampling.top_p = r.top_p;
      e.sampling.seed = seed + i;
      e.sampling.max_tokens = r.max_tokens;
      e.sampling.stop = r.stop;
      e.logprobs = r.logprobs;
      std::weak_ptr<Job> weak = job;
      e.on_token = [this, weak, i](const TokenEvent& t) {
        auto j = weak.lock();
        if (!j) return;
        std::lock_guard lock(j->m);
        auto& c = j->choices[i];
        const auto now = Clock::now();
        if (c.completion_tokens++ == 0) metrics_.first_token_seconds.observe(std::chrono::duration<double>(now - j->start).count());
        else metrics_.inter_token_seconds.observe(std::chrono::duration<double>(now - c.last_token).count());
        c.last_token = now;
        if (j->request.logprobs < 0) return;
        for (auto* lp : {&c.logprobs, &c.unsent_logprobs}) {
          lp->tokens.push_back(tokenizer_.decode({t.id}, false));
          lp->token_logprobs.push_back(t.logprob);
          lp->text_offset.push_back(static_cast<int64_t>(c.prefix.size() + c.text.size()));
          std::vector<std::pair<std::string, float>> top;
          for (const auto& [id, v] : t.top) top.emplace_back(tokenizer_.decode({id}, false), v);
          lp->top.push_back(std::move(top));
        }
      };
      e.on_text = [weak, i](const std::string& piece) {
        auto j = weak.lock();
        if (!j) return;
        std::lock_guard lock(j->m);
        auto& c = j->choices[i];
        c.text += piece;
        if (!j->request.stream) return;
        j->events.push_back(sse(j->chunk(i, piece, j->request.logprobs >= 0 ? c.unsent_logprobs.to_json() : nlohmann::json(), nullptr)));
        c.unsent_logprobs = {};
        j->cv.notify_all();
      };
      e.on_done = [weak, i](const Completion& done) {
        auto j = weak.lock();
        if (!j) return;
        std::lock_guard lock(j->m);
        auto& c = j->choices[i];
        c.done = true;
        c.finish_reason = done.finish_reason;
        c.prompt_tokens = done.prompt_tokens;
        if (j->request.stream)
          j->events.push_back(sse(j->chunk(i, "", j->request.logprobs >= 0 ? c.unsent_logprobs.to_json() : nlohmann::json(), done.finish_reason)));
        --j->remaining;
        j->cv.notify_all();
      };
      if (r.stream && r.echo) job->events.push_back(sse(job->chunk(i, choice.prefix, nullptr, nullptr)));
      std::lock_guard lock(job->m);   // the engine may answer before the id is stored
      choice.engine_id = engine_.submit(std::move(e));
      submitted.push_back(choice.engine_id);
    }
  } catch (const Error& err) {
    for (int64_t id : submitted) engine_.cancel(id);
    throw ApiError(400, err.what(), "prompt");
  }
  {
    std::lock_guard lock(jobs_mutex_);
    std::erase_if(jobs_, [](const auto& w) { return w.expired(); });
    jobs_.push_back(job);
  }
  wake_engine();
  return job;
}

void CompletionServer::require_key(const std::string& authorization) const {
  if (!options_.api_key.empty() && authorization != "Bearer " + options_.api_key)
    throw ApiError(401, "Incorrect API key provided: send \"Authorization: Bearer <key>\" with the key the server was started with", "",
                   "invalid_request_error", "invalid_api_key");
}

void CompletionServer::answer_completion(const std::string& body, const std::string& authorization, httplib::Response& res) {
  const auto start = Clock::now();
  require_key(authorization);
  if (draining_) throw ApiError(503, "the server is shutting down", "", "server_error", "shutting_down");
  const CompletionRequest r = parse_completion_request(body, options_.limits, std::min(tokenizer_.vocab_size(), engine_.vocab_size()));
  if (!r.model.empty() && r.model != options_.model_name)
    throw ApiError(404, "The model `" + r.model + "` does not exist (this server serves `" + options_.model_name + "`)", "model",
                   "invalid_request_error", "model_not_found");
  if (++metrics_.in_flight > options_.max_concurrent) {
    --metrics_.in_flight;
    throw ApiError(503, "the server is answering " + std::to_string(options_.max_concurrent) + " requests already; retry shortly", "",
                   "server_error", "too_many_requests");
  }
  std::shared_ptr<Job> job;
  auto finished = [this, start] {
    metrics_.request_seconds.observe(seconds_since(start));
    --metrics_.in_flight;
    jobs_cv_.notify_all();
  };
  try {
    job = start_job(r);
  } catch (...) {
    finished();
    throw;
  }
  if (!r.stream) {
    std::unique_lock lock(job->m);
    job->cv.wait(lock, [&] { return job->remaining == 0; });
    if (!engine_failure_.empty()) {
      lock.unlock();
      finished();
      throw ApiError(500, "the engine failed: " + engine_failure_, "", "server_error");
    }
    nlohmann::json choices = nlohmann::json::array();
    for (size_t i = 0; i < job->choices.size(); ++i) {
      const auto& c = job->choices[i];
      choices.push_back({{"text", c.prefix + c.text}, {"index", i},
                         {"logprobs", r.logprobs >= 0 ? c.logprobs.to_json() : nlohmann::json()}, {"finish_reason", c.finish_reason}});
    }
    send_json(res, 200, {{"id", job->id}, {"object", "text_completion"}, {"created", job->created}, {"model", job->model},
                         {"choices", choices}, {"usage", job->usage()}});
    lock.unlock();
    finished();
    return;
  }
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, job](size_t, httplib::DataSink& sink) {
        std::unique_lock lock(job->m);
        job->cv.wait_for(lock, std::chrono::milliseconds(100), [&] { return !job->events.empty() || job->remaining == 0; });
        std::deque<std::string> out;
        out.swap(job->events);
        const bool last = job->remaining == 0;
        std::string usage = last && job->request.include_usage
                                ? sse({{"id", job->id}, {"object", "text_completion"}, {"created", job->created},
                                       {"model", job->model}, {"choices", nlohmann::json::array()}, {"usage", job->usage()}})
                                : "";
        lock.unlock();
        for (const auto& e : out)
          if (!sink.write(e.data(), e.size())) return false;   // the client has gone: the releaser cancels
        if (!last) return sink.is_writable();
        if (!usage.empty() && !sink.write(usage.data(), usage.size())) return false;
        static const std::string done = "data: [DONE]\n\n";
        if (!sink.write(done.data(), done.size())) return false;
        sink.done();
        return true;
      },
      [this, job, finished](bool) {
        {
          std::lock_guard lock(job->m);
          for (auto& c : job->choices)
            if (!c.done && c.engine_id >= 0) engine_.cancel(c.engine_id);   // a client gone mid-stream
        }
        wake_engine();
        finished();
      });
}

void CompletionServer::install_routes() {
  auto& s = *http_;
  s.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    try {
      std::rethrow_exception(ep);
    } catch (const ApiError& e) {
      send_error(res, e);
    } catch (const std::exception& e) {
      send_error(res, ApiError(500, std::string("internal error: ") + e.what(), "", "server_error"));
    }
  });
  s.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 413)
      send_error(res, ApiError(413, "the request body is larger than this server's limit of " +
                                        std::to_string(options_.limits.max_body_bytes) + " bytes (--max-body-bytes)"));
    else if (res.status == 404)
      send_error(res, ApiError(404, "no route " + req.method + " " + req.path + " (try POST /v1/completions, GET /v1/models, /health, /metrics or /)"));
    else if (res.status >= 400)
      send_error(res, ApiError(res.status, "the request could not be read (HTTP " + std::to_string(res.status) + ")"));
  });
  auto authorized = [this](const httplib::Request& req, httplib::Response& res) {
    try {
      require_key(req.get_header_value("Authorization"));
      return true;
    } catch (const ApiError& e) {
      send_error(res, e);
      return false;
    }
  };
  s.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    try {
      answer_completion(req.body, req.get_header_value("Authorization"), res);
    } catch (const ApiError& e) {
      send_error(res, e);
    }
    metrics_.request_done(res.status < 0 ? 200 : res.status);   // a stream's status is set when it starts
  });
  s.Get("/v1/models", [this, authorized](const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req, res)) return;
    send_json(res, 200, {{"object", "list"},
                         {"data", {{{"id", options_.model_name}, {"object", "model"}, {"created", 0}, {"owned_by", "colossal"}}}}});
  });
  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (draining_) send_json(res, 503, {{"status", "shutting down"}});
    else send_json(res, 200, {{"status", "ok"}});
  });
  s.Get("/metrics", [this, authorized](const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req, res)) return;
    res.set_content(metrics_.render(engine_.stats()), "text/plain; version=0.0.4");
  });
  s.Get("/", [](const httplib::Request&, httplib::Response& res) { res.set_content(web_page(), "text/html; charset=utf-8"); });
}

}  // namespace colossal::serve
