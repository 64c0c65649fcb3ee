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
#include "src/dist/group.h"
#include "src/dist/launch_env.h"
#include "src/engine/generation_checkpoint.h"
#include "src/engine/generation_job.h"
#include "src/engine/kernel_cache.h"
#include "src/memory/huge_pages.h"
#include "src/nn/kernel_choice.h"
#include "src/quant/quant_config.h"
#include "src/serve/step_plan.h"
#include "src/serve/http_server.h"

namespace fs = std::filesystem;

namespace colossal::app {
namespace {

struct ServeArgs {
  std::string model, model_name, api_key, device = "cpu";
  serve::ServerOptions server;
  serve::EngineConfig engine;
  double kv_memory_gb = 1.0;
  std::string kv_cache = "auto";   // what the KV blocks store (CausalLM::set_kv_dtype)
  bool quiet = false;
  int64_t tensor_parallel = 1;   // ranks the model is split across (1D tensor parallelism)
};

// What each worker of a --tensor-parallel server runs: the same command, every option spelled out.
std::vector<std::string> worker_args(const ServeArgs& a) {
  const auto& l = a.server.limits;
  std::vector<std::string> out{"serve", a.model, "--host", a.server.host, "--port", std::to_string(a.server.port), "--device", a.device,
                               "--kv-memory-gb", fmt::format("{}", a.kv_memory_gb), "--kv-cache", a.kv_cache, "--block-size",
                               std::to_string(a.engine.block_size),
                               "--max-running", std::to_string(a.engine.max_running), "--max-step-tokens",
                               std::to_string(a.engine.max_step_tokens), "--max-queue", std::to_string(l.max_queue), "--max-concurrent",
                               std::to_string(a.server.max_concurrent), "--max-tokens", std::to_string(l.max_tokens), "--max-choices",
                               std::to_string(l.max_choices), "--max-body-bytes", std::to_string(l.max_body_bytes), "--shutdown-grace",
                               fmt::format("{}", a.server.shutdown_grace_s), "--tensor-parallel", std::to_string(a.tensor_parallel)};
  if (!a.model_name.empty()) out.insert(out.end(), {"--model-name", a.model_name});
  if (!a.api_key.empty()) out.insert(out.end(), {"--api-key", a.api_key});
  if (a.quiet) out.push_back("--quiet");
  return out;
}

void run(ServeArgs& a) {
  setup_logging("info", "", a.quiet);
  // SIGTERM and SIGINT go to one watcher thread (blocked here, before any thread starts: the rendezvous's,
  // and the CUDA driver's, which even asking whether a GPU is visible starts; so every thread inherits
  // it). A launcher of --tensor-parallel workers keeps them, to forward them; the other ranks of a split
  // server leave them blocked: rank 0 stops them once it stops.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  const bool launches = a.tensor_parallel > 1 && dist::worker_env(dist::process_env()).world == 1;
  if (!launches) pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  if (a.tensor_parallel > 1 && a.device == "cuda")
    throw Error("--device cuda with --tensor-parallel " + std::to_string(a.tensor_parallel) +
                ": a split server runs on the CPU (its ranks exchange pieces over Gloo); use --device cpu, or one process on the GPU");
  // A split server's ranks run on the CPU; one process takes the GPU under "cuda", or "auto" with one visible.
  const c10::Device device = a.tensor_parallel > 1 ? c10::Device(c10::kCPU) : resolve_device(a.device, "--device");
  if (a.tensor_parallel > 1) check_generation_split(a.model, a.tensor_parallel);   // before any worker starts
  const GenerationJob job = GenerationJob::start(a.tensor_parallel, [&a] { return worker_args(a); }, "--tensor-parallel");
  if (job.launched()) {
    set_exit_code(job.exit_code());
    return;
  }
  auto opened = open_generation_checkpoint(a.model, "colossal serve");
  auto model = load_generation_model(opened, "colossal serve", job.tensor_group(), /*pack_for_cpu=*/device.is_cpu(),
                                     memory::huge_pages_wanted(/*by_default=*/true));
  if (!device.is_cpu()) model->to(device);
  model->set_kv_dtype(parse_kv_cache(a.kv_cache));   // before the pool's block size is measured from it
  a.server.model_name = a.model_name.empty() ? fs::path(opened.dir).filename().string() : a.model_name;
  if (a.server.model_name.rfind("step-", 0) == 0) a.server.model_name = fs::path(opened.dir).parent_path().parent_path().filename().string();
  // The pool from --kv-memory-gb: blocks of block_size positions for every layer's keys and values.
  const auto block_bytes = static_cast<double>(serve::KvBlocks::block_bytes(*model, a.engine.block_size));
  a.engine.num_blocks = static_cast<int64_t>(a.kv_memory_gb * 1073741824.0 / block_bytes);
  if (a.engine.num_blocks < 1)
    throw Error("--kv-memory-gb " + std::to_string(a.kv_memory_gb) + " holds no KV block of " + human_bytes(block_bytes) +
                " (give at least " + std::to_string(block_bytes / 1073741824.0) + ")");
  const double pool_bytes = static_cast<double>(a.engine.num_blocks) * block_bytes;
  if (device.is_cpu()) {
    require_host_memory(pool_bytes, "the KV cache (--kv-memory-gb)");
  } else {
    const auto spare = static_cast<double>(device_total_bytes(device)) - static_cast<double>(device_allocated_bytes(device));
    if (pool_bytes > spare)
      throw Error("--kv-memory-gb " + fmt::format("{}", a.kv_memory_gb) + ": the KV cache needs " + human_bytes(pool_bytes) + " on " +
                  describe_device(device) + ", which has " + human_bytes(spare) + " beside the model; lower --kv-memory-gb");
  }
  a.engine.device = device;
  std::shared_ptr<serve::StepMirror> mirror;
  if (dist::Group* g = job.tensor_group()) mirror = std::make_shared<serve::StepMirror>(*g);
  if (!job.is_root()) {   // this rank runs the forwards rank 0 schedules, over a pool of the same blocks
    serve::KvBlocks blocks(*model, a.engine.num_blocks, a.engine.block_size);
    serve::follow_steps(*model, blocks, *mirror);
    return;
  }
  // Rank 0's last message to the others, however serving ends.
  struct StopOthers {
    std::shared_ptr<serve::StepMirror>& m;
    ~StopOthers() {
      if (m) m->stop();
    }
  } stop_others{mirror};
  // A server runs for long: timing our GEMM against ATen's for its prompt-chunk steps pays off.
  nn::KernelPolicy policy = nn::kernel_policy();
  policy.inference_gemm = nn::KernelPath::Auto;
  nn::set_kernel_policy(policy);
  KernelCacheSession kernel_cache;   // a restarted server starts with the choices it timed before; saved on stopping
  serve::BatchEngine engine(model, opened.tokenizer, a.engine);
  engine.set_mirror(mirror);
  serve::CompletionServer server(engine, opened.tokenizer, a.server);
  const int port = server.bind();
  spdlog::info("serving {} as \"{}\" on http://{}:{} ({}, {}{}{} KV blocks of {} positions{}, {}; at most {} sequences a step)",
               opened.dir, a.server.model_name, a.server.host, port, describe_device(device),
               opened.quantized ? std::string(quant::scheme_name(opened.quantized->scheme)) + ", " : "",
               a.tensor_parallel > 1 ? fmt::format("split across {} ranks, ", a.tensor_parallel) : std::string(),
               a.engine.num_blocks, a.engine.block_size, a.kv_cache == "auto" ? std::string() : " in " + a.kv_cache,
               human_bytes(pool_bytes), a.engine.max_running);
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
  cmd->add_option("--device", a->device, "cpu | cuda | auto (the GPU when one is visible; a --tensor-parallel server runs on the CPU)")->capture_default_str()
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  cmd->add_option("--kv-memory-gb", a->kv_memory_gb, "Memory for the paged KV cache")->capture_default_str()->check(finite_in(0.001, 1e6));
  cmd->add_option("--kv-cache", a->kv_cache, "What the KV blocks store: auto (the model's dtype), fp32, fp16, bf16 or int8 (fp16 and bf16 "
                  "fit twice an fp32 model's positions in --kv-memory-gb; int8, a scale per position and head, about 3.8x at "
                  "heads of 64)")
      ->capture_default_str()
      ->check(CLI::IsMember(kv_cache_choices()));
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
  cmd->add_option("--tensor-parallel", a->tensor_parallel,
                  "Split the model across N ranks (1D tensor parallelism): rank 0 serves and schedules, every rank computes its pieces")
      ->capture_default_str()->check(CLI::Range(1, 4096));
  cmd->add_flag("-q,--quiet", a->quiet, "Only warnings and errors in the log");
  cmd->callback([a] {
    a->server.api_key = a->api_key;
    run(*a);
  });
}

}  // namespace colossal::app
