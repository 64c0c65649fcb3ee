// Checkpoint quantization and its perplexity check: see quantize.h.
#include "src/engine/quantize.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <tuple>
#include <spdlog/spdlog.h>

#include "models/registry.h"
#include "src/core/error.h"
#include "src/core/text.h"
#include "src/data/token_dataset.h"
#include "src/data/tokenizer.h"
#include "src/core/device.h"
#include "src/engine/checkpoint.h"
#include "src/engine/generation_checkpoint.h"
#include "src/engine/streamed_weights.h"
#include "src/io/atomic_dir.h"
#include "src/nn/causal_lm.h"
#include "src/quant/quantized_linear.h"
#include "src/quant/calibration.h"
#include "src/quant/quantize_model.h"

namespace fs = std::filesystem;

namespace colossal {
namespace {

constexpr const char* kEmbeddedCorpus = "data/kjv/kjv.txt";

int64_t stored_bytes(const nn::Model& m) {
  int64_t n = 0;
  for (const auto& p : m.named_parameters()) n += static_cast<int64_t>(p.value().nbytes());
  return n;
}

// A text file's token ids (only its end, or only its start, when long: from a line boundary, about 16
// bytes a token covering `tokens`), or a token dataset's split; and what they are.
std::pair<std::vector<int32_t>, std::string> file_tokens(const std::string& path, const std::string& use, const std::string& split,
                                                          int64_t tokens, bool tail, const CheckpointInfo& info,
                                                          const Tokenizer& tokenizer) {
  if (path.ends_with(".h5")) {
    const auto info_h5 = read_token_dataset_info(path);
    if (info_h5.tokenizer_fingerprint != tokenizer.fingerprint())
      throw Error(use + " dataset " + path + " was tokenized with another tokenizer than " + info.dir + "'s (give a text file)");
    return {read_token_split(path, split).tokens, path + (split == "val" ? " (held-out split)" : " (training split)")};
  }
  // The end of the embedded corpus is as far from the start a short training run reads as it gets.
  std::string text = read_text_file(path);
  const size_t keep = static_cast<size_t>(tokens) * 16 + 4096;
  std::string what = path;
  if (text.size() > keep) {
    if (tail) {
      const size_t from = text.find('\n', text.size() - keep);
      text = from == std::string::npos ? std::string() : text.substr(from + 1);
    } else {
      const size_t to = text.rfind('\n', keep);
      text = to == std::string::npos ? std::string() : text.substr(0, to + 1);
    }
    what += std::string(tail ? " (its last " : " (its first ") + human_bytes(static_cast<double>(text.size())) + ")";
  }
  const auto ids = tokenizer.encode(text);
  return {std::vector<int32_t>(ids.begin(), ids.end()), what};
}

// The token ids perplexity is measured on, and what they are.
std::pair<std::vector<int32_t>, std::string> eval_tokens(const QuantizeOptions& o, const CheckpointInfo& info,
                                                          const Tokenizer& tokenizer) {
  std::string path = o.eval;
  if (path.empty()) {
    const fs::path recipe = fs::path(info.dir) / "recipe.toml";
    if (fs::is_regular_file(recipe)) {
      try {
        const Recipe r = parse_recipe(read_text_file(recipe.string()), recipe.string());
        if (!r.data.dataset.empty() && fs::is_regular_file(r.data.dataset)) path = r.data.dataset;
      } catch (const std::exception& e) {
        spdlog::warn("quantize: {} could not be read for its held-out split ({}); using {}", recipe.string(), e.what(), kEmbeddedCorpus);
      }
    }
    if (path.empty()) path = kEmbeddedCorpus;
  }
  if (!fs::is_regular_file(path))
    throw Error("perplexity text " + path + ": no such file (give --eval FILE: a text file or a token dataset .h5, or --eval-tokens 0)");
  return file_tokens(path, "perplexity", "val", o.eval_tokens, /*tail=*/true, info, tokenizer);
}

// Windows of w + 1 ids, end to end, covering at most `limit` scored tokens.
std::vector<at::Tensor> windows_of(std::vector<int32_t>& ids, int64_t w, int64_t limit) {
  std::vector<at::Tensor> out;
  for (int64_t s = 0, n = 0; s + w + 1 <= static_cast<int64_t>(ids.size()) && n + w <= limit; s += w, n += w)
    out.push_back(at::from_blob(ids.data() + s, {w + 1}, at::kInt).to(at::kLong));
  return out;
}

// exp(mean next-token cross entropy) over `windows` (each [W + 1] ids), four at a time: `loss(ids,
// targets)` gives a batch's mean.
double perplexity_of(const std::vector<at::Tensor>& windows, const std::function<at::Tensor(const at::Tensor&, const at::Tensor&)>& loss) {
  at::NoGradGuard no_grad;
  double sum = 0;
  for (size_t i = 0; i < windows.size(); i += 4) {
    const size_t n = std::min<size_t>(4, windows.size() - i);
    auto batch = at::stack(at::TensorList(windows).slice(i, n));   // [n, W + 1]
    const int64_t w = batch.size(1) - 1;
    sum += loss(batch.narrow(1, 0, w), batch.narrow(1, 1, w)).item<double>() * static_cast<double>(n);
  }
  return std::exp(sum / static_cast<double>(windows.size()));
}

double perplexity(nn::CausalLM& model, const std::vector<at::Tensor>& windows) {
  return perplexity_of(windows, [&](const at::Tensor& ids, const at::Tensor& targets) { return model.loss(ids, targets); });
}

// The same through a KV cache of `kv`: each batch of windows is one prefill into a fresh cache, whose
// attention writes every key and value into the cache and reads them back as stored (an int8 cache's
// rows quantized, a 16-bit one's rounded), as each later decoding step would, then cross entropy over
// the logits.
double cached_perplexity(nn::CausalLM& model, const std::vector<at::Tensor>& windows, std::optional<at::ScalarType> kv) {
  const auto kept = model.kv_dtype();
  model.set_kv_dtype(kv);
  const double ppl = perplexity_of(windows, [&](const at::Tensor& ids, const at::Tensor& targets) {
    nn::KvCache cache = model.make_cache(ids.size(0), ids.size(1), c10::Device(c10::kCPU));
    nn::ForwardOptions fo;
    fo.cache = &cache;
    const at::Tensor logits = model.forward(ids, fo);   // [n, W, V]
    return at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}).to(at::kFloat), targets.reshape({-1}));
  });
  model.set_kv_dtype(kept);
  return ppl;
}

// A causal LM over a model directory whose blocks stream from the disk while it runs (StreamedWeights):
// perplexity and calibration passes over a model that does not fit in memory. `factory` builds the
// model's layers with deferred parameters.
class StreamedLM {
 public:
  StreamedLM(const std::string& dir, const ModelConfig& config, nn::LayerFactory& factory, const std::string& cache_dir) {
    model_ = nn::model_as<nn::CausalLM>(build_model(config, factory, /*initialise=*/false), "colossal quantize");
    stream_ = stream_blocks(*model_, HfWeights::open(dir), c10::Device(c10::kCPU), cache_dir);
    model_->eval();
    spdlog::info("streaming {}'s blocks ({}) {}", dir, human_bytes(static_cast<double>(stream_->block_bytes())),
                 stream_->in_place() ? "in place" : "through a cache in " + cache_dir);
  }
  ~StreamedLM() { stream_->stop(); }   // the reading thread uses the model
  StreamedLM(const StreamedLM&) = delete;
  StreamedLM& operator=(const StreamedLM&) = delete;
  nn::CausalLM& operator*() { return *model_; }

 private:
  std::shared_ptr<nn::CausalLM> model_;
  std::shared_ptr<StreamedWeights> stream_;
};

// Whether to work block at a time: asked for, or both models would take more than half of what this
// process may hold (the passes over text need room beside them).
bool streams(const QuantizeOptions& o, const CheckpointInfo& info) {
  const double params = static_cast<double>(count_parameters(info.model));
  const double need = params * (4.0 + o.config.bits() / 8.0);
  if (o.stream_weights == "on") return true;
  const std::string whole = "quantizing " + info.dir + " whole (fp32 and quantized; --stream-weights on works a block at a time)";
  if (o.stream_weights == "off") {
    require_host_memory(need, whole);
    return false;
  }
  if (o.stream_weights != "auto")
    throw Error("--stream-weights " + o.stream_weights + ": expected auto, on or off");
  const double usable = static_cast<double>(usable_memory_bytes());
  if (need <= 0.5 * usable) return false;
  spdlog::info("quantizing block at a time: the fp32 and quantized models would take {}, more than half of the {} this process may hold",
               human_bytes(need), human_bytes(usable));
  return true;
}

// The calibration windows' per-channel input ranges of every linear layer (SmoothQuant), and what they are.
std::pair<std::map<std::string, at::Tensor>, std::string> calibrate(const QuantizeOptions& o, const CheckpointInfo& info,
                                                                    const Tokenizer& tokenizer, nn::CausalLM& model,
                                                                    quant::CalibrationFactory& recording, int64_t w, int64_t& tokens) {
  const std::string path = o.calib.empty() ? kEmbeddedCorpus : o.calib;
  if (!fs::is_regular_file(path)) throw Error("calibration text " + path + ": no such file (give --calib FILE: a text file or a token dataset .h5)");
  auto [ids, what] = file_tokens(path, "calibration", "train", o.calib_tokens, /*tail=*/false, info, tokenizer);
  const auto windows = windows_of(ids, w, o.calib_tokens);
  if (windows.empty()) throw Error("calibration text " + what + " has fewer than " + std::to_string(w + 1) + " tokens");
  recording.set_recording(true);
  (void)perplexity(model, windows);
  recording.set_recording(false);
  tokens = static_cast<int64_t>(windows.size()) * w;
  return {recording.absmax(model), what};
}

// The held-out windows both models are scored on, noted in the report.
std::vector<at::Tensor> eval_windows(const QuantizeOptions& o, const CheckpointInfo& info, const Tokenizer& tokenizer, int64_t w,
                                     int64_t limit, QuantizeReport& r) {
  auto [ids, what] = eval_tokens(o, info, tokenizer);
  auto windows = windows_of(ids, w, limit);
  if (windows.empty())
    throw Error("perplexity text " + what + " has " + std::to_string(ids.size()) + " tokens, fewer than one window of " + std::to_string(w + 1));
  r.eval_tokens = static_cast<int64_t>(windows.size()) * w;
  r.eval_source = what;
  return windows;
}

// What either way reports of the models: the layers quantized and the weights' bytes before and after.
void report_sizes(QuantizeReport& r, const quant::QuantizedLayerFactory& factory, const nn::Model& source, const nn::Model& quantized) {
  r.layers = factory.layers();
  r.embedding = factory.embeddings() > 0;
  r.bytes_before = stored_bytes(source);
  r.bytes_after = stored_bytes(quantized);
}

// config.json's quantization_config, which infer and serve read back.
nlohmann::json quantized_config(const QuantizeOptions& o) { return {{"quantization_config", quant::to_json(o.config)}}; }

std::shared_ptr<nn::Model> build_quantized(const CheckpointInfo& info, quant::QuantizedLayerFactory& factory, const QuantizeOptions& o) {
  try {
    return build_model(info.model, factory, /*initialise=*/false);
  } catch (const Error& e) {
    throw Error(std::string("cannot quantize ") + info.dir + " with " + quant::scheme_name(o.config.scheme) + " (group size " +
                std::to_string(o.config.group) + "): " + e.what());
  }
}

// Block at a time: each source tensor is read (read_model_state, one at a time), quantized and written
// to the output's files at once (their headers are planned from shapes alone), and the passes over text
// stream the blocks of the source and of the written output from the disk.
QuantizeReport quantize_streamed(const QuantizeOptions& o, const CheckpointInfo& info, const std::optional<Tokenizer>& tokenizer,
                                 int64_t eval_limit) {
  nn::LayerFactory deferred(nn::ParamStorage::deferred);
  const auto source = nn::model_as<nn::CausalLM>(build_model(info.model, deferred, /*initialise=*/false), "colossal quantize");
  const int64_t w = std::min<int64_t>(source->context_length(), 512);
  QuantizeReport r;
  r.streamed = true;
  std::map<std::string, at::Tensor> ranges;
  if (o.config.scheme == quant::Scheme::int8_smoothquant) {
    quant::CalibrationFactory recording(nn::ParamStorage::deferred);
    StreamedLM calib(info.dir, info.model, recording, o.stream_cache);
    std::tie(ranges, r.calib_source) = calibrate(o, info, *tokenizer, *calib, recording, w, r.calib_tokens);
  }
  quant::QuantizedLayerFactory qfactory(o.config, nn::ParamStorage::deferred);
  const auto quantized = build_quantized(info, qfactory, o);
  const auto dst = quant::quantized_params(*quantized);
  const auto& names = quantized->hf_names();
  std::vector<SafetensorsWriter::Entry> entries;   // in the order the source's tensors come
  for (const auto& p : source->named_parameters())
    for (const auto& n : quant::quantized_names(p.key(), dst))
      for (auto& e : hf_entries(names.to_hf(n), dst.at(n).sizes(), dst.at(n).scalar_type())) entries.push_back(std::move(e));
  HfWeights weights = HfWeights::open(info.dir);
  weights.set_mapped_reads(true);   // each tensor converted at once and let go
  int64_t files = 0;
  r.out = save_model_dir_streamed(
      o.out, *quantized, std::move(entries),
      [&](const TensorSink& write) {
        read_model_state(*source, weights, [&](const std::string& name, const at::Tensor& value) {
          for (const auto& [n, t] : quant::quantize_parameter(name, value, dst, o.config, &ranges))
            for (const auto& piece : hf_pieces(names.to_hf(n), t)) write(piece.name, piece.tensor);
        }, {}, /*views=*/true);
      },
      o.max_shard_bytes, info.tokenizer_files, info.config, quantized_config(o), &files);
  r.files = files;
  report_sizes(r, qfactory, *source, *quantized);
  if (eval_limit > 0) {
    const auto windows = eval_windows(o, info, *tokenizer, w, eval_limit, r);
    {
      StreamedLM before(info.dir, info.model, deferred, o.stream_cache);
      r.ppl_before = perplexity(*before, windows);
    }
    quant::QuantizedLayerFactory out_factory(o.config, nn::ParamStorage::deferred);
    StreamedLM after(r.out, info.model, out_factory, o.stream_cache);
    r.ppl_after = perplexity(*after, windows);
    if (!o.kv_cache.empty()) r.ppl_kv = cached_perplexity(*after, windows, parse_kv_cache(o.kv_cache));
  }
  return r;
}

}  // namespace

QuantizeReport quantize_checkpoint(const QuantizeOptions& o) {
  quant::check_group(o.config.scheme, o.config.group);
  const std::string dir = resolve_checkpoint(o.input);
  auto info = read_checkpoint_info(dir);
  if (const std::string task = model_task(info.model); task != "causal_lm")
    throw Error("colossal quantize needs a causal language model (GPT-2, OPT, BLOOM); " + dir + " holds a " + info.model.family +
                " model trained for " + task);
  if (quant::quant_config_of(info.config, dir + "/config.json"))
    throw Error("checkpoint " + dir + " is already quantized; quantize the fp32 checkpoint it came from");
  if (fs::weakly_canonical(o.out) == fs::weakly_canonical(dir))
    throw Error("--out " + o.out + " is the input checkpoint itself; choose another directory");
  if (o.max_shard_bytes == 0) throw Error("--max-shard-gb must be above 0");
  const bool streamed = streams(o, info);
  const int64_t eval_limit = o.eval_tokens >= 0 ? o.eval_tokens : streamed ? 2048 : 16384;
  std::optional<Tokenizer> tokenizer;
  if (eval_limit > 0 || o.config.scheme == quant::Scheme::int8_smoothquant) tokenizer = Tokenizer::from_files(info.tokenizer_files, dir);
  if (streamed) return quantize_streamed(o, info, tokenizer, eval_limit);

  // The fp32 model, whose linear layers also note their inputs' ranges while calibrating (SmoothQuant).
  quant::CalibrationFactory recording;
  auto source = nn::model_as<nn::CausalLM>(build_model(info.model, recording, /*initialise=*/false), "colossal quantize");
  load_model_state(*source, HfWeights::open(dir));
  source->eval();
  const int64_t w = std::min<int64_t>(source->context_length(), 512);
  quant::QuantizedLayerFactory qfactory(o.config);
  auto quantized = nn::model_as<nn::CausalLM>(build_quantized(info, qfactory, o), "colossal quantize");
  quantized->eval();
  QuantizeReport r;
  std::map<std::string, at::Tensor> ranges;
  if (o.config.scheme == quant::Scheme::int8_smoothquant)
    std::tie(ranges, r.calib_source) = calibrate(o, info, *tokenizer, *source, recording, w, r.calib_tokens);
  quant::quantize_into(*source, *quantized, o.config, &ranges);
  report_sizes(r, qfactory, *source, *quantized);
  if (eval_limit > 0) {
    const auto windows = eval_windows(o, info, *tokenizer, w, eval_limit, r);
    r.ppl_before = perplexity(*source, windows);
    r.ppl_after = perplexity(*quantized, windows);
    if (!o.kv_cache.empty()) r.ppl_kv = cached_perplexity(*quantized, windows, parse_kv_cache(o.kv_cache));
  }
  r.out = save_model_dir(o.out, *quantized, info.tokenizer_files, info.config, quantized_config(o));
  return r;
}

}  // namespace colossal
