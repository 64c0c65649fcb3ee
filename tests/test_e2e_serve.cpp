// `colossal serve` end to end, as a client on loopback sees it: a trained tiny GPT served with an API key
// and tight limits; concurrent streaming clients each getting `colossal infer`'s greedy completion; the
// non-streamed shape with n, echo and log-probabilities; malformed, oversized, unknown-model, too-long and
// queue-overflowing requests refused with a reason while the server keeps serving; a client that hangs
// up mid-stream having its sequence cancelled; SIGTERM letting an in-flight stream finish and the process
// exit 0; and the web page streaming a prompt in headless Chromium. Every wait is bounded.
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

#include <torch/cuda.h>

#include "support/test_support.h"

using colossal::test::read_file;
using colossal::test::run_colossal;
using colossal::test::TempDir;

namespace {

using namespace std::chrono_literals;

// A `colossal serve` process on a free port; killed when this goes out of scope, if still running.
class ServerProcess {
 public:
  ServerProcess(const std::string& args, const TempDir& dir) : out_(dir / "serve.out"), err_(dir / "serve.err") {
    // A server before it in the same directory left its log: its port must not be taken for this one's.
    std::filesystem::remove(out_);
    std::filesystem::remove(err_);
    const std::string cmd = "cd '" + colossal::test::source_dir() + "' && exec '" + colossal::test::binary_path() + "' serve " + args +
                            " --port 0 >'" + out_ + "' 2>'" + err_ + "'";
    pid_ = fork();
    if (pid_ == 0) {
      execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    const std::regex listening("listening on http://127\\.0\\.0\\.1:(\\d+)");
    for (int i = 0; i < 600 && port_ == 0 && running(); ++i) {   // 60 s at most
      std::smatch m;
      const std::string out = std::filesystem::exists(out_) ? read_file(out_) : "";
      if (std::regex_search(out, m, listening)) port_ = std::stoi(m[1]);
      else std::this_thread::sleep_for(100ms);
    }
  }
  ~ServerProcess() {
    if (running()) kill(pid_, SIGKILL), waitpid(pid_, nullptr, 0);
  }
  int port() const { return port_; }
  bool running() {
    if (exited_) return false;
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) exited_ = true, status_ = status;
    return !exited_;
  }
  // SIGTERM, then the exit status once it has exited (bounded), or -1.
  int terminate_and_wait(std::chrono::seconds limit) {
    kill(pid_, SIGTERM);
    for (auto until = std::chrono::steady_clock::now() + limit; std::chrono::steady_clock::now() < until; std::this_thread::sleep_for(50ms))
      if (!running()) return WIFEXITED(status_) ? WEXITSTATUS(status_) : 128 + WTERMSIG(status_);
    return -1;
  }
  std::string log() const { return read_file(out_) + read_file(err_); }

 private:
  std::string out_, err_;
  pid_t pid_ = -1;
  int port_ = 0, status_ = 0;
  bool exited_ = false;
};

struct Stream {
  int status = 0;
  std::string text, finish_reason, raw;
  bool done = false;   // "data: [DONE]" arrived
};

// POST /v1/completions with "stream": true, reading server-sent events; `stop_after` > 0 hangs up after
// that many chunks; `first_chunk` is set when the first one arrives.
Stream stream_completion(int port, const nlohmann::json& body, const std::string& key, int stop_after = 0,
                         std::atomic<bool>* first_chunk = nullptr) {
  httplib::Client cli("127.0.0.1", port);
  cli.set_read_timeout(60, 0);
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.set_header("Content-Type", "application/json");
  if (!key.empty()) req.set_header("Authorization", "Bearer " + key);
  req.body = body.dump();
  Stream s;
  int chunks = 0;
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    s.raw.append(data, len);
    for (size_t cut; (cut = s.raw.find("\n\n")) != std::string::npos; s.raw.erase(0, cut + 2)) {
      const std::string event = s.raw.substr(0, cut);
      if (event == "data: [DONE]") {
        s.done = true;
        continue;
      }
      if (event.rfind("data: ", 0) != 0) continue;
      const auto j = nlohmann::json::parse(event.substr(6));
      for (const auto& c : j["choices"]) {
        s.text += c["text"].get<std::string>();
        if (!c["finish_reason"].is_null()) s.finish_reason = c["finish_reason"];
      }
      if (first_chunk) *first_chunk = true;
      if (stop_after > 0 && ++chunks >= stop_after) return false;
    }
    return true;
  };
  httplib::Response res;
  httplib::Error error;
  cli.send(req, res, error);
  s.status = res.status;
  if (res.status != 200) s.raw = res.body;
  return s;
}

nlohmann::json metrics_value(int port, const std::string& name) {
  httplib::Client cli("127.0.0.1", port);
  auto r = cli.Get("/metrics", {{"Authorization", "Bearer sekret"}});
  if (!r) return nullptr;
  std::smatch m;
  if (!std::regex_search(r->body, m, std::regex("\n" + name + " (\\d+)"))) return nullptr;
  return std::stoll(m[1]);
}

// A tiny GPT trained `steps` steps into dir/run (its tokenizer and data beside it); returns the run.
std::string train_tiny(const TempDir& dir, int steps) {
  auto train = run_colossal("train recipes/gpt-tiny.toml --set train.max_steps=" + std::to_string(steps) + " --set train.eval_every=0 -q" +
                            " --set output.dir=" + (dir / "run") + " --set data.tokenizer=" + (dir / "tok.model") +
                            " --set data.dataset=" + (dir / "data.h5"));
  EXPECT_EQ(train.exit_code, 0) << train.output;
  return dir / "run";
}

// `colossal infer`'s greedy completion of `prompt`: what the server must stream for it.
std::string greedy_completion(const std::string& model, const std::string& prompt, int tokens, const std::string& options = "") {
  auto r = run_colossal("infer " + model + " -p '" + prompt + "' -n " + std::to_string(tokens) + " --greedy --jsonl -q" + options);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return r.exit_code == 0 ? nlohmann::json::parse(r.output)["completion"].get<std::string>() : "";
}

// Each prompt streamed greedily for 12 tokens by a client of its own, all at once: each gets `expected`.
void expect_streams_at_once(int port, const std::vector<std::string>& prompts, const std::vector<std::string>& expected) {
  std::vector<Stream> streams(prompts.size());
  std::vector<std::thread> clients;
  for (size_t i = 0; i < prompts.size(); ++i)
    clients.emplace_back([&, i] {
      streams[i] = stream_completion(port, {{"prompt", prompts[i]}, {"max_tokens", 12}, {"temperature", 0}, {"stream", true}}, "");
    });
  for (auto& t : clients) t.join();
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(streams[i].text, expected[i]) << "prompt " << i;
    EXPECT_TRUE(streams[i].done);
  }
}

}  // namespace

TEST(ServeEndToEnd, ConcurrentStreamsGetInfersTokensAndBadClientsGetReasonsWhileOthersAreServed) {
  TempDir dir;
  const std::string model = train_tiny(dir, 60);
  const std::vector<std::string> prompts = {"And God said", "In the beginning", "The LORD is my shepherd", "Blessed are the poor"};
  std::vector<std::string> expected;
  for (const auto& p : prompts) expected.push_back(greedy_completion(model, p, 12));
  ASSERT_FALSE(HasFailure());

  ServerProcess server(model + " --api-key sekret --max-queue 4 --max-running 4 --kv-memory-gb 0.01 --max-body-bytes 4096 "
                               "--max-tokens 100 --shutdown-grace 20",
                       dir);
  ASSERT_GT(server.port(), 0) << server.log();
  const int port = server.port();
  httplib::Client cli("127.0.0.1", port);
  const httplib::Headers auth{{"Authorization", "Bearer sekret"}};
  auto health = cli.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(cli.Get("/v1/models")->status, 401) << "the API key is required";
  auto models = cli.Get("/v1/models", auth);
  EXPECT_EQ(nlohmann::json::parse(models->body)["data"][0]["id"], "run");

  // Four clients streaming at once: each gets infer's greedy completion, then [DONE].
  std::vector<Stream> streams(prompts.size());
  std::vector<std::thread> clients;
  for (size_t i = 0; i < prompts.size(); ++i)
    clients.emplace_back([&, i] {
      streams[i] = stream_completion(port, {{"prompt", prompts[i]}, {"max_tokens", 12}, {"temperature", 0}, {"stream", true}}, "sekret");
    });
  for (auto& t : clients) t.join();
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(streams[i].status, 200) << streams[i].raw;
    EXPECT_EQ(streams[i].text, expected[i]) << "prompt " << i;
    EXPECT_TRUE(streams[i].done) << "prompt " << i;
    EXPECT_FALSE(streams[i].finish_reason.empty());
  }

  // Not streamed: two choices of a sampled completion with the prompt echoed and two alternatives a token.
  auto full = cli.Post("/v1/completions", auth,
                       nlohmann::json{{"prompt", "And God said"}, {"max_tokens", 5}, {"n", 2}, {"echo", true}, {"logprobs", 2}, {"seed", 4}}.dump(),
                       "application/json");
  ASSERT_TRUE(full);
  ASSERT_EQ(full->status, 200) << full->body;
  const auto body = nlohmann::json::parse(full->body);
  ASSERT_EQ(body["choices"].size(), 2u);
  for (const auto& c : body["choices"]) {
    EXPECT_EQ(c["text"].get<std::string>().rfind("And God said", 0), 0u) << c;
    EXPECT_EQ(c["logprobs"]["tokens"].size(), c["logprobs"]["token_logprobs"].size());
    EXPECT_EQ(c["logprobs"]["top_logprobs"][0].size(), 2u);
  }
  EXPECT_EQ(body["usage"]["completion_tokens"].get<int>(), static_cast<int>(body["choices"][0]["logprobs"]["tokens"].size() +
                                                                             body["choices"][1]["logprobs"]["tokens"].size()));

  // Refusals with a reason, each in OpenAI's error shape.
  auto refused = [&](const std::string& payload) {
    auto r = cli.Post("/v1/completions", auth, payload, "application/json");
    return r ? std::make_pair(r->status, nlohmann::json::parse(r->body)["error"]["message"].get<std::string>()) : std::make_pair(0, std::string());
  };
  EXPECT_EQ(refused("{\"prompt\": ").first, 400);
  EXPECT_EQ(refused(R"({"prompt": "x", "max_tokens": "many"})").first, 400);
  EXPECT_EQ(refused(R"({"prompt": "x", "model": "gpt-4"})").first, 404);
  EXPECT_EQ(refused(nlohmann::json{{"prompt", std::string(5000, 'a')}}.dump()).first, 413);
  std::string long_prompt;
  for (int i = 0; i < 60; ++i) long_prompt += "and the LORD ";
  const auto too_long = refused(nlohmann::json{{"prompt", long_prompt}, {"max_tokens", 50}}.dump());
  EXPECT_EQ(too_long.first, 400);
  EXPECT_NE(too_long.second.find("maximum context length is 128 tokens"), std::string::npos) << too_long.second;
  const auto full_queue = refused(R"({"prompt": ["a", "b", "c", "d", "e"], "max_tokens": 4})");
  EXPECT_EQ(full_queue.first, 429);
  EXPECT_NE(full_queue.second.find("the queue is full"), std::string::npos) << full_queue.second;
  EXPECT_EQ(cli.Post("/v1/completions", nlohmann::json{{"prompt", "x"}}.dump(), "application/json")->status, 401);

  // A client that hangs up after its first chunk: its sequence is cancelled and its blocks come back.
  const auto gone = stream_completion(port, {{"prompt", "And God said"}, {"max_tokens", 100}, {"temperature", 0}, {"stream", true}}, "sekret", 1);
  EXPECT_FALSE(gone.done);
  nlohmann::json running, blocks;
  for (int i = 0; i < 100; ++i, std::this_thread::sleep_for(100ms)) {
    running = metrics_value(port, "colossal_running_sequences"), blocks = metrics_value(port, "colossal_kv_blocks_used");
    if (running == 0 && blocks == 0) break;
  }
  EXPECT_EQ(running, 0) << "the hung-up stream's sequence is still running";
  EXPECT_EQ(blocks, 0);
  EXPECT_LT(metrics_value(port, "colossal_generated_tokens_total").get<int64_t>(), 4 * 12 + 10 + 100) << "it ran to its end";
  const auto after = stream_completion(port, {{"prompt", prompts[0]}, {"max_tokens", 12}, {"temperature", 0}, {"stream", true}}, "sekret");
  EXPECT_EQ(after.text, expected[0]) << "the server keeps serving";

  // SIGTERM while a stream is running (its first chunk is in, 99 tokens to go): it finishes, the process exits 0.
  Stream last;
  std::atomic<bool> streaming{false};
  std::thread in_flight([&] {
    last = stream_completion(port, {{"prompt", "In the beginning"}, {"max_tokens", 100}, {"temperature", 0}, {"stream", true}}, "sekret",
                             0, &streaming);
  });
  for (int i = 0; i < 1000 && !streaming; ++i) std::this_thread::sleep_for(1ms);
  EXPECT_TRUE(streaming) << "the stream never started";   // not ASSERT: the client thread must be joined
  EXPECT_EQ(server.terminate_and_wait(60s), 0) << server.log();
  in_flight.join();
  EXPECT_NE(server.log().find("1 request(s) in flight get 20 s to finish"), std::string::npos) << server.log();
  EXPECT_TRUE(last.done) << last.raw;
  EXPECT_EQ(last.finish_reason, "length");
  EXPECT_NE(server.log().find("serve: stopped"), std::string::npos) << server.log();
}

TEST(ServeEndToEnd, TheWebPageStreamsATypedPromptInAHeadlessBrowser) {
  TempDir dir;
  const std::string completion = greedy_completion(train_tiny(dir, 40), "And God said", 8);
  ASSERT_FALSE(HasFailure());
  ServerProcess server(dir / "run", dir);
  ASSERT_GT(server.port(), 0) << server.log();
  std::string why, dom;
  // Chromium's virtual time runs on once the response's headers are in, so on a loaded machine the page
  // can be dumped before the first tokens arrive (the first request also times the kernels): up to three
  // tries, the later ones against a warm server.
  for (int attempt = 0; attempt < 3 && (attempt == 0 || (!dom.empty() && dom.find("data-state=\"done\"") == std::string::npos)); ++attempt)
    dom = colossal::test::headless_dom("http://127.0.0.1:" + std::to_string(server.port()) +
                                           "/?prompt=And%20God%20said&max_tokens=8&temperature=0&auto=1",
                                       dir.path(), 20000, why);
  if (dom.empty()) GTEST_SKIP() << why;
  EXPECT_NE(dom.find("data-state=\"done\""), std::string::npos) << dom.substr(0, 3000);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(dom, m, std::regex("<pre id=\"out\"><b>And God said</b>([^<]*)</pre>"))) << dom.substr(0, 3000);
  // The page shows the text as HTML: &amp; &lt; &gt; stand for their characters.
  std::string shown = m[1];
  for (auto [entity, c] : {std::pair{"&amp;", "&"}, {"&lt;", "<"}, {"&gt;", ">"}})
    for (size_t at; (at = shown.find(entity)) != std::string::npos;) shown.replace(at, std::string(entity).size(), c);
  EXPECT_EQ(shown, completion);
  EXPECT_NE(dom.find("model: run"), std::string::npos) << "the page read /v1/models";
}

TEST(ServeEndToEnd, OpenAisPythonClientGetsInfersCompletionStreamedAndNot) {
  const std::string python = colossal::test::source_dir() + "/.venv/bin/python";
  if (std::system((python + " -c 'import openai' >/dev/null 2>&1").c_str()) != 0)
    GTEST_SKIP() << "no openai package in .venv (scripts/setup.sh installs it for test builds)";
  TempDir dir;
  const std::string completion = greedy_completion(train_tiny(dir, 40), "And God said", 12);
  ASSERT_FALSE(HasFailure());
  ServerProcess server(dir / "run", dir);
  ASSERT_GT(server.port(), 0) << server.log();
  colossal::test::write_file(dir / "client.py", R"(import json, sys
from openai import OpenAI
client = OpenAI(base_url="http://127.0.0.1:%s/v1" % sys.argv[1], api_key="unused", max_retries=0, timeout=60)
model = client.models.list().data[0].id
whole = client.completions.create(model=model, prompt="And God said", max_tokens=12, temperature=0)
streamed = "".join(chunk.choices[0].text for chunk in client.completions.create(
    model=model, prompt="And God said", max_tokens=12, temperature=0, stream=True) if chunk.choices)
try:
    client.completions.create(model="no-such-model", prompt="x", max_tokens=1)
    missing = "accepted"
except Exception as e:
    missing = type(e).__name__
print(json.dumps({"model": model, "text": whole.choices[0].text, "finish": whole.choices[0].finish_reason,
                  "completion_tokens": whole.usage.completion_tokens, "streamed": streamed, "missing": missing}))
)");
  std::string out;
  {
    const std::string cmd = python + " " + (dir / "client.py") + " " + std::to_string(server.port()) + " 2>&1";
    std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), pclose);
    char buf[4096];
    for (size_t n; (n = fread(buf, 1, sizeof buf, pipe.get())) > 0;) out.append(buf, n);
  }
  const auto j = nlohmann::json::parse(out.substr(out.rfind('{')), nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << out;
  EXPECT_EQ(j["model"], "run");
  EXPECT_EQ(j["text"], completion);
  EXPECT_EQ(j["streamed"], completion);
  EXPECT_EQ(j["finish"], "length");
  EXPECT_EQ(j["completion_tokens"], 12);
  EXPECT_EQ(j["missing"], "NotFoundError") << "a 404 the client maps to its own error";
}

TEST(ServeEndToEnd, AQuantizedDirectoryWithANarrowKvCacheStreamsWhatInferGeneratesFromIt) {
  // int4 weights, and keys and values kept in fp16 or as int8 rows (--kv-cache) on both sides: infer's
  // contiguous cache and the server's blocks store them alike.
  TempDir dir;
  const std::string model = train_tiny(dir, 40);
  auto q = run_colossal("quantize " + model + " --out " + (dir / "q4") + " --scheme int4-weight --group-size 32 --eval-tokens 0 -q");
  ASSERT_EQ(q.exit_code, 0) << q.output;
  const std::vector<std::string> prompts = {"And God said", "In the beginning God created"};
  for (const std::string kv : {"fp16", "int8"}) {
    std::vector<std::string> expected;
    for (const auto& p : prompts) expected.push_back(greedy_completion(dir / "q4", p, 12, " --kv-cache " + kv));
    ASSERT_FALSE(HasFailure()) << kv;
    ServerProcess server(dir / "q4" + " --kv-cache " + kv, dir);
    ASSERT_GT(server.port(), 0) << server.log();
    EXPECT_NE(server.log().find("int4-weight"), std::string::npos) << server.log();
    EXPECT_NE(server.log().find("positions in " + kv), std::string::npos) << server.log();
    expect_streams_at_once(server.port(), prompts, expected);
  }
}

// On a GPU (a suite named *OnGpu keeps the GPU visible under ctest; it skips where none is): the model,
// its paged KV cache and ATen's paged attention on the device, and each of four concurrent streams the
// CPU's greedy completion (fp32 on both; the tiny model's margins between tokens dwarf the GPU's rounding),
// then SIGTERM ending it with status 0.
TEST(ServeOnGpu, ConcurrentStreamsGetTheCpusGreedyTokensAndSigtermStopsIt) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA GPU visible";
  TempDir dir;
  const std::string model = train_tiny(dir, 40);
  const std::vector<std::string> prompts = {"And God said", "In the beginning God created", "The LORD is my shepherd", "Jesus wept"};
  std::vector<std::string> expected;
  for (const auto& p : prompts) expected.push_back(greedy_completion(model, p, 12, " --device cpu"));
  ASSERT_FALSE(HasFailure());
  ServerProcess server(model + " --device cuda --kv-memory-gb 0.05 --block-size 4 --max-running 3", dir);
  ASSERT_GT(server.port(), 0) << server.log();
  EXPECT_NE(server.log().find("cuda"), std::string::npos) << server.log();
  expect_streams_at_once(server.port(), prompts, expected);
  EXPECT_EQ(server.terminate_and_wait(30s), 0) << server.log();
}

TEST(ServeEndToEnd, ATensorParallelServerStreamsWhatOneProcessGeneratesAndStopsOnSigterm) {
  // Two ranks: rank 0 serves and schedules, both compute their heads of every step.
  TempDir dir;
  const std::string model = train_tiny(dir, 40);
  const std::vector<std::string> prompts = {"And God said", "In the beginning God created"};
  std::vector<std::string> expected;
  for (const auto& p : prompts) expected.push_back(greedy_completion(model, p, 12));
  ASSERT_FALSE(HasFailure());
  ServerProcess server(model + " --tensor-parallel 2", dir);
  ASSERT_GT(server.port(), 0) << server.log();
  EXPECT_NE(server.log().find("split across 2 ranks"), std::string::npos) << server.log();
  std::this_thread::sleep_for(1500ms);   // idle passes keep the other rank waiting, not timing out
  expect_streams_at_once(server.port(), prompts, expected);
  EXPECT_EQ(server.terminate_and_wait(30s), 0) << server.log();
}
