// Checkpoint quantization and its perplexity check: see quantize.h.
#include "src/engine/quantize.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <cmath>
#include <filesystem>
#include <map>
#include <optional>
#include <spdlog/spdlog.h>

#include "models/registry.h"
#include "src/core/error.h"
#include "src/core/text.h"
#include "src/data/token_dataset.h"
#include "src/data/tokenizer.h"
#include "src/engine/checkpoint.h"
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

// exp(mean next-token cross entropy) over `windows` (each [W + 1] ids), four at a time.
double perplexity(nn::CausalLM& model, const std::vector<at::Tensor>& windows) {
  at::NoGradGuard no_grad;
  double sum = 0;
  for (size_t i = 0; i < windows.size(); i += 4) {
    const size_t n = std::min<size_t>(4, windows.size() - i);
    auto batch = at::stack(at::TensorList(windows).slice(i, n));   // [n, W + 1]
    const int64_t w = batch.size(1) - 1;
    sum += model.loss(batch.narrow(1, 0, w), batch.narrow(1, 1, w)).item<double>() * static_cast<double>(n);
  }
  return std::exp(sum / static_cast<double>(windows.size()));
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

  // The fp32 model, whose linear layers also note their inputs' ranges while calibrating (SmoothQuant).
  quant::CalibrationFactory recording;
  auto source = nn::model_as<nn::CausalLM>(build_model(info.model, recording, /*initialise=*/false), "colossal quantize");
  load_model_state(*source, HfWeights::open(dir));
  source->eval();
  const int64_t w = std::min<int64_t>(source->context_length(), 512);
  std::optional<Tokenizer> tokenizer;
  if (o.eval_tokens > 0 || o.config.scheme == quant::Scheme::int8_smoothquant) tokenizer = Tokenizer::from_files(info.tokenizer_files, dir);
  quant::QuantizedLayerFactory qfactory(o.config);
  std::shared_ptr<nn::CausalLM> quantized;
  try {
    quantized = nn::model_as<nn::CausalLM>(build_model(info.model, qfactory, /*initialise=*/false), "colossal quantize");
  } catch (const Error& e) {
    throw Error(std::string("cannot quantize ") + dir + " with " + quant::scheme_name(o.config.scheme) + " (group size " +
                std::to_string(o.config.group) + "): " + e.what());
  }
  quantized->eval();
  QuantizeReport r;
  std::map<std::string, at::Tensor> ranges;
  if (o.config.scheme == quant::Scheme::int8_smoothquant) {
    const std::string path = o.calib.empty() ? kEmbeddedCorpus : o.calib;
    if (!fs::is_regular_file(path)) throw Error("calibration text " + path + ": no such file (give --calib FILE: a text file or a token dataset .h5)");
    auto [ids, what] = file_tokens(path, "calibration", "train", o.calib_tokens, /*tail=*/false, info, *tokenizer);
    const auto windows = windows_of(ids, w, o.calib_tokens);
    if (windows.empty()) throw Error("calibration text " + what + " has fewer than " + std::to_string(w + 1) + " tokens");
    recording.set_recording(true);
    (void)perplexity(*source, windows);
    recording.set_recording(false);
    ranges = recording.absmax(*source);
    r.calib_source = what;
    r.calib_tokens = static_cast<int64_t>(windows.size()) * w;
  }
  quant::quantize_into(*source, *quantized, o.config, &ranges);

  r.layers = qfactory.layers();
  r.embedding = qfactory.embeddings() > 0;
  r.bytes_before = stored_bytes(*source);
  r.bytes_after = stored_bytes(*quantized);
  if (o.eval_tokens > 0) {
    auto [ids, what] = eval_tokens(o, info, *tokenizer);
    const auto windows = windows_of(ids, w, o.eval_tokens);
    r.eval_tokens = static_cast<int64_t>(windows.size()) * w;
    if (windows.empty())
      throw Error("perplexity text " + what + " has " + std::to_string(ids.size()) + " tokens, fewer than one window of " + std::to_string(w + 1));
    r.eval_source = what;
    r.ppl_before = perplexity(*source, windows);
    r.ppl_after = perplexity(*quantized, windows);
  }
  nlohmann::json extra = {{"quantization_config", quant::to_json(o.config)}};
  r.out = save_model_dir(o.out, *quantized, info.tokenizer_files, info.config, extra);
  return r;
}

}  // namespace colossal
