// `colossal quantize IN --out DIR --scheme int8-weight|int4-weight [--group-size N]`: writes a quantized
// copy of a causal-LM checkpoint and prints what it saved and what it cost in perplexity
// (src/engine/quantize.h).
#include <algorithm>
#include <cmath>
#include <memory>
#include <spdlog/spdlog.h>

#include "apps/colossal/commands.h"
#include "src/core/log.h"
#include "src/core/text.h"
#include "src/engine/generation_checkpoint.h"
#include "src/engine/quantize.h"

namespace colossal::app {

void add_quantize_command(CLI::App& app) {
  struct Args {
    std::string input, out, scheme = "int8-weight", eval, calib, stream_weights = "auto", stream_cache = "/var/tmp", kv_cache;
    int64_t group = -1;   // -1: the scheme's default
    int64_t eval_tokens = -1, calib_tokens = 8192;   // -1: by how the model is held (QuantizeOptions)
    double max_shard_gb = 5;
    double alpha = 0.5;
    bool quiet = false;
  };
  auto args = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("quantize", "Write an int8 or int4 weight-quantized copy of a causal-LM checkpoint, with its size "
                                             "and perplexity change");
  cmd->add_option("input", args->input, "Checkpoint, run or Hugging Face model directory (fp32, bf16 or fp16)")->required();
  cmd->add_option("--out", args->out, "Directory to write the quantized model to")->required();
  cmd->add_option("--scheme", args->scheme,
                  "int8-weight (per channel or per group), int4-weight (per group) or int8-smoothquant (W8A8 with SmoothQuant's "
                  "smoothing from a calibration pass)")->capture_default_str();
  cmd->add_option("--calib", args->calib, "int8-smoothquant's calibration text (.txt) or token dataset (.h5, its training split); "
                                          "default: the start of data/kjv/kjv.txt");
  cmd->add_option("--calib-tokens", args->calib_tokens, "Tokens the calibration pass runs")->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  cmd->add_option("--alpha", args->alpha, "SmoothQuant's migration strength: s = max|X|^alpha / max|W|^(1 - alpha)")
      ->capture_default_str()->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--group-size", args->group,
                  "Inputs sharing one scale: a multiple of 32 dividing every layer's input width; 0 = per output channel (int8 only). "
                  "Default: 0 for int8-weight, 128 for int4-weight");
  cmd->add_option("--eval", args->eval,
                  "Held-out text (.txt) or token dataset (.h5, its val split) for the perplexity check (default: the held-out split "
                  "of the dataset the checkpoint's recipe names, else data/kjv/kjv.txt)");
  cmd->add_option("--eval-tokens", args->eval_tokens,
                  "Tokens to score for the perplexity check (0: skip it). Default: 16384, or 2048 when working block at a time")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  cmd->add_option("--kv-cache", args->kv_cache,
                  "Also score the quantized model through a KV cache of fp32, fp16, bf16 or int8 (as `infer --kv-cache` keeps it), "
                  "so the perplexity line shows the cost of both")
      ->check(CLI::IsMember([] {   // infer's kinds but "auto": the line names the kind it measured
        auto kinds = kv_cache_choices();
        kinds.erase(std::remove(kinds.begin(), kinds.end(), "auto"), kinds.end());
        return kinds;
      }()));
  cmd->add_option("--stream-weights", args->stream_weights,
                  "on: block at a time, for a model larger than memory (each tensor read, quantized and written at once; the "
                  "perplexity and calibration passes stream the blocks from the disk); off: the whole model in memory; auto: on "
                  "when the fp32 and quantized models would take more than half the memory this process may hold")
      ->capture_default_str()->check(CLI::IsMember({"auto", "on", "off"}));
  cmd->add_option("--stream-cache", args->stream_cache,
                  "Directory for the streamed passes' cache file, where a model's layout cannot be read in place (OPT, BLOOM, "
                  "fp16/bf16 files; removed on exit)")->capture_default_str();
  cmd->add_option("--max-shard-gb", args->max_shard_gb,
                  "Largest safetensors file written, in GB (10^9 bytes); beyond it model-0000k-of-0000N.safetensors with an index, as "
                  "transformers' save_pretrained shards")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_flag("-q,--quiet", args->quiet, "Only the summary lines");
  cmd->callback([args] {
    setup_logging("info", "", args->quiet);
    QuantizeOptions o;
    o.input = args->input;
    o.out = args->out;
    o.config.scheme = quant::parse_scheme(args->scheme);
    o.config.group = args->group >= 0 ? args->group : quant::default_group(o.config.scheme);
    o.config.alpha = args->alpha;
    o.eval = args->eval;
    o.eval_tokens = args->eval_tokens;
    o.calib = args->calib;
    o.calib_tokens = args->calib_tokens;
    o.kv_cache = args->kv_cache;
    o.stream_weights = args->stream_weights;
    o.stream_cache = args->stream_cache;
    o.max_shard_bytes = static_cast<uint64_t>(std::max(1.0, std::round(args->max_shard_gb * 1e9)));
    const QuantizeReport r = quantize_checkpoint(o);
    std::printf("quantized %lld linear layers to %s (%s)%s: weights %s -> %s (%.2fx smaller)\n", static_cast<long long>(r.layers),
                quant::scheme_name(o.config.scheme),
                o.config.group > 0 ? ("groups of " + std::to_string(o.config.group)).c_str() : "one scale per output channel",
                r.embedding ? " and the token embedding (the tied head) to int8 rows" : "",
                human_bytes(static_cast<double>(r.bytes_before)).c_str(), human_bytes(static_cast<double>(r.bytes_after)).c_str(),
                static_cast<double>(r.bytes_before) / static_cast<double>(std::max<int64_t>(r.bytes_after, 1)));
    if (r.calib_tokens > 0)
      std::printf("calibrated on %lld tokens of %s (alpha %.2f)\n", static_cast<long long>(r.calib_tokens), r.calib_source.c_str(), o.config.alpha);
    if (r.eval_tokens > 0)
      std::printf("perplexity on %lld tokens of %s: %.4f -> %.4f (%+.2f%%)\n", static_cast<long long>(r.eval_tokens),
                  r.eval_source.c_str(), r.ppl_before, r.ppl_after, 100.0 * (r.ppl_after / r.ppl_before - 1.0));
    if (r.eval_tokens > 0 && r.ppl_kv > 0)
      std::printf("perplexity through a KV cache of %s: %.4f (%+.2f%% against the quantized model without it, %+.2f%% against the input)\n",
                  o.kv_cache.c_str(), r.ppl_kv, 100.0 * (r.ppl_kv / r.ppl_after - 1.0), 100.0 * (r.ppl_kv / r.ppl_before - 1.0));
    std::printf("wrote %s%s%s\n", r.out.c_str(), r.files > 1 ? (" (" + std::to_string(r.files) + " safetensors files)").c_str() : "",
                r.streamed ? ", block at a time" : "");
  });
}

}  // namespace colossal::app
