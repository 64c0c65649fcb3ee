// `colossal serve MODEL`: loads a causal LM (fp32 or quantized) and answers OpenAI's completions API over
// HTTP with continuous batching on a paged KV cache (src/serve/http_server.h). SIGTERM or Ctrl-C stop it
// cleanly: new requests are refused, in-flight ones finish or are cancelled, then it exits 0.
#include <csignal>
#include <filesystem>
#include <memory>
#include <pthread.h>
#include <spdlog/spdlog.h>
#include <thread>

#include "apps/colossal/cli_checks.h"
#include "apps/colossal/commands.h"
#include "src/core/device.h"
#include "src/core/error.h"
#include "src/core/log.h"
#include "src/core/text.h"
#include "src/engine/generation_checkpoint.h"
#include "src/serve/http_server.h"

namespace fs = std::filesystem;

namespace colossal::app {
namespace {

struct ServeArgs {
  std::string model, model_name, api_key, device = "cpu";
  serve::ServerOptions server;
  serve::EngineConfig engine;
  double kv_memory_gb = 1.0;
  bool quiet = false;
};

void run(ServeArgs& a) {
  setup_logging("info", "", a.quiet);
  if (resolve_device(a.device, "--device").is_cuda())
    throw Error("colossal serve runs its paged KV cache and batch on the CPU; --device cuda is not available for it (use --device cpu)");
  // SIGTERM and SIGINT go to one watcher thread (blocked here, before any thread starts, so every thread inherits it).
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto opened = open_generation_checkpoint(a.model, "colossal serve");
  auto model = load_generation_model(opened, "colossal serve");
  a.server.model_name = a.model_name.empty() ? fs::path(opened.dir).filename().string() : a.model_name;
  if (a.server.model_name.rfind("step-", 0) == 0) a.server.model_name = fs::path(opened.dir).parent_path().parent_path().filename().string();
  // The pool from --kv-memory-gb: blocks of block_size positions for every layer's keys and values.
  const auto block_bytes = static_cast<double>(serve::KvBlocks::block_bytes(*model, a.engine.block_size));
  a.engine.num_blocks = static_cast<int64_t>(a.kv_memory_gb * 1073741824.0 / block_bytes);
  if (a.engine.num_blocks < 1)
    throw Error("--kv-memory-gb " + std::to_string(a.kv_memory_gb) + " holds no KV block of " + human_bytes(block_bytes) +
                " (give at least " + std::to_string(block_bytes / 1073741824.0) + ")");
  require_host_memory(static_cast<double>(a.engine.num_blocks) * block_bytes, "the KV cache (--kv-memory-gb)");
  serve::BatchEngine engine(model, opened.tokenizer, a.engine);
  serve::CompletionServer server(engine, opened.tokenizer, a.server);
  const int port = server.bind();
  spdlog::info("serving {} as \"{}\" on http://{}:{} ({}{} KV blocks of {} positions, {}; at most {} sequences a step)", opened.dir,
               a.server.model_name, a.server.host, port, opened.quantized ? std::string(quant::scheme_name(opened.quantized->scheme)) + ", " : "",
               a.engine.num_blocks, a.engine.block_size, human_bytes(static_cast<double>(a.engine.num_blocks) * block_bytes),
               a.engine.max_running);
  std::printf("listening on http://%s:%d\n", a.server.host.c_str(), port);
  std::fflush(stdout);
  std::atomic<bool> served{false};
  std::thread watcher([&] {
    const timespec tick{0, 200'000'000};
    while (!served) {
      if (sigtimedwait(&signals, nullptr, &tick) > 0) {
        spdlog::info("serve: signal received");
        server.shutdown();
        return;
      }
    }
  });
  server.serve();
  served = true;
  watcher.join();
  spdlog::info("serve: stopped");
}

}  // namespace

void add_serve_command(CLI::App& app) {
  auto a = std::make_shared<ServeArgs>();
  auto* cmd = app.add_subcommand("serve", "Serve a causal LM over HTTP: OpenAI's completions API, continuous batching, a web page at /");
  cmd->add_option("model", a->model, "Checkpoint, run or Hugging Face model directory (fp32, bf16/fp16 or colossal quantize's)")->required();
  cmd->add_option("--host", a->server.host, "Address to listen on (127.0.0.1 keeps it to this machine)")->capture_default_str();
  cmd->add_option("--port", a->server.port, "Port (0: any free one, printed at start)")->capture_default_str()->check(CLI::Range(0, 65535));
  cmd->add_option("--api-key", a->api_key, "Require \"Authorization: Bearer KEY\" on /v1/* and /metrics (also $COLOSSAL_API_KEY)")
      ->envname("COLOSSAL_API_KEY");
  cmd->add_option("--model-name", a->model_name, "The model's id in the API (default: the directory's name)");
  cmd->add_option("--device", a->device, "cpu (the serving engine's kernels are CPU ones)")->capture_default_str()
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  cmd->add_option("--kv-memory-gb", a->kv_memory_gb, "Memory for the paged KV cache")->capture_default_str()->check(finite_in(0.001, 1e6));
  cmd->add_option("--block-size", a->engine.block_size, "Positions a KV block holds")->capture_default_str()->check(CLI::Range(1, 1024));
  cmd->add_option("--max-running", a->engine.max_running, "Sequences in the running batch at most")->capture_default_str()->check(CLI::Range(1, 4096));
  cmd->add_option("--max-step-tokens", a->engine.max_step_tokens, "Tokens one engine step computes at most (decodes first, then prompt chunks)")
      ->capture_default_str()->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--max-queue", a->server.limits.max_queue, "Sequences waiting beyond the batch before requests get 429")
      ->capture_default_str()->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--max-concurrent", a->server.max_concurrent, "Completion requests answered at once before 503")
      ->capture_default_str()->check(CLI::Range(1, 4096));
  cmd->add_option("--max-tokens", a->server.limits.max_tokens, "The largest max_tokens a request may ask for")
      ->capture_default_str()->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--max-choices", a->server.limits.max_choices, "Completions one request may ask for (prompts x n)")
      ->capture_default_str()->check(CLI::Range(1, 1024));
  cmd->add_option("--max-body-bytes", a->server.limits.max_body_bytes, "Largest request body (413 beyond)")
      ->capture_default_str()->check(CLI::Range(int64_t{64}, int64_t{1} << 30));
  cmd->add_option("--shutdown-grace", a->server.shutdown_grace_s, "Seconds in-flight requests get on SIGTERM before they are cancelled")
      ->capture_default_str()->check(finite_in(0.0, 3600.0));
  cmd->add_flag("-q,--quiet", a->quiet, "Only warnings and errors in the log");
  cmd->callback([a] {
    a->server.api_key = a->api_key;
    run(*a);
  });
}

}  // namespace colossal::app
