// `colossal infer CHECKPOINT`: load a checkpoint and its tokenizer and generate, streaming a single
// completion to stdout or printing a batch of them (prompts from a file).
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "apps/colossal/cli_checks.h"
#include "apps/colossal/commands.h"
#include "src/core/device.h"
#include "src/core/error.h"
#include "src/core/log.h"
#include "src/core/text.h"
#include "src/engine/checkpoint.h"
#include "src/engine/generation_checkpoint.h"
#include "src/engine/generation_job.h"
#include "src/engine/generator.h"
#include "src/engine/kernel_cache.h"
#include "src/engine/streamed_weights.h"
#include "models/registry.h"
#include "src/memory/huge_pages.h"
#include "src/nn/kernel_choice.h"
#include "src/quant/quant_config.h"
#include "src/quant/quantized_linear.h"

namespace fs = std::filesystem;

namespace colossal::app {
namespace {

struct InferArgs {
  std::string checkpoint;
  std::vector<std::string> prompts;
  std::string prompts_file;
  SamplingConfig sampling;
  std::string device = "auto";
  std::string kernels = "auto";
  std::string kv_cache = "auto";   // what the KV cache stores (CausalLM::set_kv_dtype)
  bool jsonl = false;
  bool quiet = false;
  bool stream_weights = false;   // each block's weights read from the disk as it runs (src/engine/streamed_weights.h)
  bool no_cuda_graphs = false;   // decode steps launched op by op on a GPU (src/engine/decode_graphs.h)
  std::string stream_source = "auto";      // in place from the checkpoint, or through a cache file
  std::string stream_io = "auto";          // O_DIRECT or the page cache, by what fits
  std::string stream_cache = "/var/tmp";   // where a cache file goes
  int64_t tensor_parallel = 1;   // ranks the model is split across (1D tensor parallelism)
};

// What each worker of a --tensor-parallel job runs: the same command, every option spelled out.
std::vector<std::string> worker_args(const InferArgs& a) {
  std::vector<std::string> out{"infer", a.checkpoint};
  for (const auto& p : a.prompts) out.insert(out.end(), {"--prompt", p});
  if (!a.prompts_file.empty()) out.insert(out.end(), {"--prompts", a.prompts_file});
  const SamplingConfig& s = a.sampling;
  out.insert(out.end(), {"--max-tokens", std::to_string(s.max_tokens), "--temperature", fmt::format("{}", s.temperature), "--top-k",
                         std::to_string(s.top_k), "--top-p", fmt::format("{}", s.top_p), "--seed", std::to_string(s.seed), "--device",
                         a.device, "--kernels", a.kernels, "--kv-cache", a.kv_cache, "--tensor-parallel",
                         std::to_string(a.tensor_parallel)});
  if (s.greedy) out.push_back("--greedy");
  for (const auto& stop : s.stop) out.insert(out.end(), {"--stop", stop});
  if (a.jsonl) out.push_back("--jsonl");
  if (a.quiet) out.push_back("--quiet");
  return out;
}

// One prompt per line; "\n" inside a line stands for a newline.
std::vector<std::string> read_prompts(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error("prompts file " + path + ": " + (fs::exists(path) ? "cannot be read" : "no such file"));
  std::vector<std::string> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    std::string p;
    for (size_t i = 0; i < line.size(); ++i) {
      if (line[i] == '\\' && i + 1 < line.size() && line[i + 1] == 'n') p += '\n', ++i;
      else p += line[i];
    }
    out.push_back(p);
  }
  if (out.empty()) throw Error("prompts file " + path + ": no prompts (one per line)");
  return out;
}

void run(InferArgs& a) {
  setup_logging("info", "", a.quiet);
  if (a.tensor_parallel > 1) {   // what would make every worker fail is refused before any starts
    if (a.stream_weights) throw Error("--stream-weights reads whole blocks, so it runs in one process (drop --tensor-parallel)");
    if (a.device == "cuda")
      throw Error("--device cuda with --tensor-parallel " + std::to_string(a.tensor_parallel) +
                  ": split generation runs on the CPU (its ranks exchange pieces over Gloo); use --device cpu, or one process on the GPU");
    check_generation_split(a.checkpoint, a.tensor_parallel);
  }
  const GenerationJob job = GenerationJob::start(a.tensor_parallel, [&a] { return worker_args(a); }, "--tensor-parallel");
  if (job.launched()) {
    set_exit_code(job.exit_code());
    return;
  }
  dist::Group* tensor_group = job.tensor_group();
  if (!job.is_root()) setup_logging("warn", "", true);   // rank 0 speaks for the job
  const bool speak = job.is_root();
  std::vector<std::string> prompts = a.prompts;
  if (!a.prompts_file.empty()) {
    auto more = read_prompts(a.prompts_file);
    prompts.insert(prompts.end(), more.begin(), more.end());
  }
  if (prompts.empty()) throw Error("no prompt: give --prompt TEXT (repeatable) or --prompts FILE");
  // Prompts must be UTF-8 in every output mode (JSON cannot carry other bytes, and a prompt that is
  // not text is a wrong file far more often than an intended one).
  for (size_t i = 0; i < prompts.size(); ++i) {
    const size_t at = invalid_utf8_at(prompts[i]);
    if (at == std::string::npos) continue;
    const size_t flags = a.prompts.size();
    const std::string which = i < flags ? "--prompt #" + std::to_string(i + 1)
                                        : "prompt " + std::to_string(i - flags + 1) + " of " + a.prompts_file;
    throw Error(which + " is not valid UTF-8 (byte " + std::to_string(at) + "); prompts must be UTF-8 text");
  }

  auto opened = open_generation_checkpoint(a.checkpoint, "colossal infer");
  const std::string& dir = opened.dir;
  const auto& info = opened.info;
  auto& tokenizer = opened.tokenizer;
  // A split model runs on the CPU ("auto" too): its groups are Gloo's, which carry host memory.
  const c10::Device device = a.tensor_parallel > 1 ? c10::Device(c10::kCPU) : resolve_device(a.device, "--device");
  // A quantized checkpoint (colossal quantize) builds the same model with quantized linear layers.
  const auto& quantized = opened.quantized;
  // The weights pass through host memory on any device (read there, then moved); each rank of a
  // tensor-parallel job holds its share.
  if (!a.stream_weights)
    require_host_memory((quantized ? quantized->bits() / 8.0 : 4.0) * static_cast<double>(count_parameters(info.model)) /
                            static_cast<double>(a.tensor_parallel),
                        "the model in " + dir + (quantized ? " (--stream-weights reads its blocks one at a time instead)"
                                                              : " (fp32 weights; --stream-weights reads them block by block instead)"));
  const std::string user = "colossal infer (text generation)";
  std::shared_ptr<nn::CausalLM> model;
  if (a.stream_weights) {   // shapes only: the streamer fills each block as it runs
    // Quantized blocks stream their integers and scales as stored (the row layout: no packing for the
    // GEMM, which would rewrite each block on every read), a quarter or an eighth of fp32's bytes a token.
    std::unique_ptr<nn::LayerFactory> deferred =
        quantized ? std::make_unique<quant::QuantizedLayerFactory>(*quantized, nn::ParamStorage::deferred)
                  : std::make_unique<nn::LayerFactory>(nn::ParamStorage::deferred);
    model = nn::model_as<nn::CausalLM>(build_model(info.model, *deferred, /*initialise=*/false), user);
  } else {
    model = load_generation_model(opened, user, tensor_group, /*pack_for_cpu=*/device.is_cpu(),
                                  memory::huge_pages_wanted(/*by_default=*/false));
  }
  model->set_kv_dtype(parse_kv_cache(a.kv_cache));
  if (a.kv_cache != "auto") spdlog::info("KV cache: {} keys and values (read back in the model's dtype as attention reads them)", a.kv_cache);
  std::shared_ptr<StreamedWeights> streamed;
  // The reading thread uses the model, so any read in flight ends before the model goes, however this
  // function is left (the hook chain inside the model owns the streamer too).
  struct StopStreaming {
    std::shared_ptr<StreamedWeights>& s;
    ~StopStreaming() {
      if (s) s->stop();
    }
  } stop_streaming{streamed};
  if (a.stream_weights) {
    streamed = stream_blocks(*model, HfWeights::open(dir), device, a.stream_cache, parse_stream_source(a.stream_source),
                             parse_stream_io(a.stream_io));
    const std::string from = streamed->in_place() ? "in place from the checkpoint's files"
                                                  : "from a " + human_bytes(static_cast<double>(streamed->cache_bytes())) + " cache in " + a.stream_cache;
    spdlog::info("streaming {}'s blocks ({}) {} ({}; {} parameters, {} of them kept outside the blocks) on {}", dir,
                 human_bytes(static_cast<double>(streamed->block_bytes())), from,
                 streamed->direct() ? "O_DIRECT" : streamed->mapped() ? "mapped, through the page cache" : "page cache",
                 model->parameter_count(), human_bytes(static_cast<double>(streamed->resident_bytes())), describe_device(device));
  } else {
    model->to(device);
    spdlog::info("loaded {} ({} parameters{}{}) on {}", dir, count_parameters(info.model),
                 quantized ? std::string(", ") + quant::scheme_name(quantized->scheme) + " linear layers" : std::string(),
                 a.tensor_parallel > 1 ? fmt::format(", split across {} ranks: {} here", a.tensor_parallel, model->parameter_count())
                                       : std::string(),
                 describe_device(device));
  }

  const nn::KernelPath kernels = nn::parse_kernel_path(a.kernels);
  // A forced side covers the prefill's GEMM too. Auto times it where the choices are kept for later runs
  // (engine/kernel_cache.h), and otherwise leaves it on ATen's (see KernelPolicy::inference_gemm).
  const bool cached = kernel_cache_path().has_value();
  nn::set_kernel_policy({kernels, kernels, kernels, kernels, kernels,
                         kernels == nn::KernelPath::Auto && !cached ? nn::KernelPath::Aten : kernels});
  KernelCacheSession kernel_cache;   // loads this machine's earlier choices; saves at the end
  Generator generator(model, tokenizer, device);
  generator.set_captured_decoding(!a.no_cuda_graphs);
  const bool stream = prompts.size() == 1 && !a.jsonl && speak;
  bool echoed = false;   // the prompt is echoed with the first piece, after the prompts were validated
  auto echo_prompt = [&] {
    if (stream && !echoed) std::fputs(prompts[0].c_str(), stdout);
    echoed = true;
  };
  const auto t0 = std::chrono::steady_clock::now();
  auto results = generator.generate(prompts, a.sampling, [&](size_t, const std::string& piece) {
    if (!stream) return;
    echo_prompt();
    std::fputs(piece.c_str(), stdout);
    std::fflush(stdout);
  });
  if (!speak) return;   // every rank computed the same tokens; rank 0 prints them
  echo_prompt();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int64_t generated = 0;
  for (size_t i = 0; i < results.size(); ++i) {
    generated += results[i].completion_tokens;
    if (stream) {
      std::fputs("\n", stdout);
    } else if (a.jsonl) {
      nlohmann::json j = {{"prompt", prompts[i]}, {"completion", results[i].text}, {"finish_reason", results[i].finish_reason},
                          {"prompt_tokens", results[i].prompt_tokens}, {"completion_tokens", results[i].completion_tokens}};
      // A completion can end inside a multi-byte character (the length limit cuts between byte
      // pieces): such bytes print as U+FFFD instead of failing the whole batch.
      std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    } else {
      std::printf("=== sample %zu ===\n%s%s\n", i + 1, prompts[i].c_str(), results[i].text.c_str());
    }
  }
  std::fflush(stdout);
  spdlog::info("generated {} tokens for {} prompt(s) in {:.2f} s ({:.1f} tokens/s)", generated, prompts.size(), secs,
               secs > 0 ? static_cast<double>(generated) / secs : 0.0);
  const auto& t = generator.last_timing();
  spdlog::info("timing: prefill {} tokens in {:.1f} ms | decode {} steps x {} sequences in {:.4f} s ({:.1f} tokens/s){} | KV cache {}",
               t.prefill_tokens, t.prefill_s * 1e3, t.decode_steps, t.batch, t.decode_s,
               t.decode_s > 0 ? static_cast<double>(t.decode_steps * t.batch) / t.decode_s : 0.0,
               t.captured_steps > 0 ? fmt::format(", {} of them CUDA graph replays ({} captured)", t.captured_steps, t.captures)
                                    : std::string(),
               human_bytes(static_cast<double>(t.kv_cache_bytes)));
  if (streamed) {
    streamed->stop();   // the first block's read for a token that never comes
    spdlog::info("streamed weights: {} block reads, {} read ({:.2f} GiB/s over the run), at most {} blocks in memory",
                 streamed->blocks_read(), human_bytes(static_cast<double>(streamed->bytes_read())),
                 secs > 0 ? static_cast<double>(streamed->bytes_read()) / secs / 1073741824.0 : 0.0, streamed->most_blocks_held());
  }
}

}  // namespace

void add_infer_command(CLI::App& app) {
  auto a = std::make_shared<InferArgs>();
  auto* cmd = app.add_subcommand("infer", "Generate text from a checkpoint (KV cache; greedy or sampled)");
  cmd->add_option("checkpoint", a->checkpoint, "Checkpoint directory, or a run/checkpoints directory (uses `latest`)")->required();
  cmd->add_option("-p,--prompt", a->prompts, "Prompt text (repeatable; several prompts run as one batch)");
  cmd->add_option("--prompts", a->prompts_file, "File with one prompt per line (\\n for a newline inside one)");
  cmd->add_option("-n,--max-tokens", a->sampling.max_tokens, "Tokens to generate at most")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  cmd->add_option("-t,--temperature", a->sampling.temperature, "Sampling temperature (0 = greedy)")->capture_default_str()->check(finite_in(0.0, 100.0));
  cmd->add_option("--top-k", a->sampling.top_k, "Sample among the k most likely tokens (0 = off)")->capture_default_str()->check(whole_up_to(INT64_MAX));
  cmd->add_option("--top-p", a->sampling.top_p, "Sample from the smallest set holding this probability (1 = off)")->capture_default_str()->check(finite_in(0.0, 1.0));
  cmd->add_flag("--greedy", a->sampling.greedy, "Always take the most likely token");
  cmd->add_option("--seed", a->sampling.seed, "Sampling seed (same seed, same output)")->capture_default_str()->check(whole_up_to(UINT64_MAX));
  cmd->add_option("--stop", a->sampling.stop, "Stop when the completion contains this text (repeatable; \\n allowed)");
  cmd->add_option("--device", a->device, "auto | cpu | cuda (a --tensor-parallel job runs on the CPU)")->capture_default_str()->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  cmd->add_option("--kernels", a->kernels, "CPU kernels: auto (time ours against ATen per shape at first use), fused or aten")
      ->capture_default_str()->check(CLI::IsMember({"auto", "fused", "aten"}));
  cmd->add_option("--kv-cache", a->kv_cache, "What the KV cache stores: auto (the model's dtype), fp32, fp16 or bf16 (half the memory "
                  "and the bytes a step reads from it), or int8 with a scale per position and head (a quarter, plus 4 bytes a "
                  "row); attention still computes in the model's dtype")
      ->capture_default_str()
      ->check(CLI::IsMember(kv_cache_choices()));
  cmd->add_flag("--jsonl", a->jsonl, "Print one JSON object per prompt instead of text");
  cmd->add_flag("--no-cuda-graphs", a->no_cuda_graphs,
                "On a GPU, launch each decoding step's kernels one by one instead of replaying the step as a captured CUDA graph");
  cmd->add_flag("--stream-weights", a->stream_weights,
                "Keep the blocks' weights on disk: read each block as it runs, the next one while it computes (a model larger than memory)");
  cmd->add_option("--stream-source", a->stream_source,
                  "Where --stream-weights reads the blocks: auto (in place from the checkpoint's safetensors where it holds them as "
                  "computed, GPT-2's layouts; else a cache), checkpoint (in place, or an error saying why not) or cache")
      ->capture_default_str()->check(CLI::IsMember({"auto", "checkpoint", "cache"}));
  cmd->add_option("--stream-io", a->stream_io,
                  "How --stream-weights reads: auto (O_DIRECT when the blocks pass half the memory this process may hold, else the "
                  "page cache), direct or page-cache (a checkpoint read in place is then mapped)")
      ->capture_default_str()->check(CLI::IsMember({"auto", "direct", "page-cache"}));
  cmd->add_option("--stream-cache", a->stream_cache, "Directory for --stream-weights' cache file when it needs one (on a fast local disk; removed on exit)")
      ->capture_default_str();
  cmd->add_option("--tensor-parallel", a->tensor_parallel,
                  "Split the model across N ranks (1D tensor parallelism): started here as N workers, or joined inside a job of N "
                  "ranks (torchrun, srun); each reads only its pieces")
      ->capture_default_str()->check(CLI::Range(1, 4096));
  cmd->add_flag("-q,--quiet", a->quiet, "No log lines, only the generated text");
  cmd->callback([a] {
    for (auto& s : a->sampling.stop) {
      for (size_t pos; (pos = s.find("\\n")) != std::string::npos;) s.replace(pos, 2, "\n");
    }
    run(*a);
  });
}

}  // namespace colossal::app
