// Batched KV-cache generation: see generator.h.
#include "src/engine/generator.h"

#include <chrono>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/CPUGeneratorImpl.h>
#include <spdlog/spdlog.h>

#include "src/core/error.h"
#include "src/engine/decode_graphs.h"
#include "src/engine/text_stream.h"

namespace colossal {
namespace {

// Per-sequence decoding state: its text so far and whether it has finished.
struct Sequence {
  TextStream text;
  bool done = false;
  GenerationResult result;
};

}  // namespace

Generator::Generator(std::shared_ptr<nn::CausalLM> model, Tokenizer tokenizer, c10::Device device)
    : model_(std::move(model)), tokenizer_(std::move(tokenizer)), device_(device) {}

std::vector<GenerationResult> Generator::generate(const std::vector<std::string>& prompts, const SamplingConfig& c,
                                                  const std::function<void(size_t, const std::string&)>& on_text) {
  if (prompts.empty()) return {};
  const int64_t b = static_cast<int64_t>(prompts.size()), context = model_->context_length();
  std::vector<std::vector<int>> encoded;
  int64_t longest = 0;
  const std::optional<int> eos = tokenizer_.end_of_text();
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto ids = tokenizer_.encode(prompts[i], /*add_special=*/true);   // as transformers' tokenizer(prompt)
    if (ids.empty() && !eos)
      throw Error("prompt " + std::to_string(i + 1) + " is empty and the tokenizer has no end-of-text token to start from");
    if (ids.empty()) ids.push_back(*eos);   // an empty prompt starts a fresh document
    if (static_cast<int64_t>(ids.size()) >= context)
      throw Error("prompt " + std::to_string(i + 1) + " has " + std::to_string(ids.size()) +
                  " tokens but the model's context is " + std::to_string(context) +
                  " (shorten it to at most " + std::to_string(context - 1) + " tokens)");
    longest = std::max<int64_t>(longest, static_cast<int64_t>(ids.size()));
    encoded.push_back(std::move(ids));
  }
  int64_t max_new = c.max_tokens;
  if (longest + max_new > context) {
    max_new = context - longest;
    spdlog::warn("max tokens reduced to {} so the longest prompt ({} tokens) fits the context of {}", max_new, longest, context);
  }

  at::NoGradGuard no_grad;
  model_->eval();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(c.seed);
  auto long_opts = at::TensorOptions().dtype(at::kLong);

  // Left padding: sequence i's real tokens occupy [pad_i, longest).
  std::vector<int64_t> pad(b);
  at::Tensor ids = at::full({b, longest}, eos.value_or(0), long_opts);   // padding: masked out, any id
  bool ragged = false;
  for (int64_t i = 0; i < b; ++i) {
    pad[i] = longest - static_cast<int64_t>(encoded[i].size());
    ragged |= pad[i] > 0;
    for (size_t j = 0; j < encoded[i].size(); ++j) ids[i][pad[i] + static_cast<int64_t>(j)] = encoded[i][j];
  }
  at::Tensor pad_t = at::tensor(pad, long_opts).view({b, 1});
  auto cache = model_->make_cache(b, longest + max_new, device_);

  nn::ForwardOptions prefill;
  prefill.cache = &cache;
  prefill.last_only = true;
  if (ragged) {
    auto pos = at::arange(longest, long_opts).view({1, longest});
    prefill.positions = (pos - pad_t).clamp_min(0).to(device_);                      // [B, T]
    auto q = pos.view({1, longest, 1}), k = pos.view({1, 1, longest});
    // Causal, padding invisible; a padding query sees itself so its softmax row is never empty.
    auto mask = (k <= q) & ((k >= pad_t.view({b, 1, 1})) | (k == q));
    prefill.mask = mask.unsqueeze(1).to(device_);                                    // [B, 1, T, T]
  }
  timing_ = {};
  for (const auto& layer : cache.layers) timing_.kv_cache_bytes += static_cast<int64_t>(layer.k.nbytes() + layer.v.nbytes());
  auto clock_start = std::chrono::steady_clock::now();
  auto lap = [&] {
    const auto now = std::chrono::steady_clock::now();
    const double s = std::chrono::duration<double>(now - clock_start).count();
    clock_start = now;
    return s;
  };
  at::Tensor logits = model_->forward(ids.to(device_), prefill).squeeze(1);          // [B, V]
  logits = logits.to(at::kCPU);   // waits for the device (so the prefill's time is its own); sampling reads it there
  timing_.prefill_s = lap();
  timing_.batch = b;
  timing_.prefill_tokens = b * longest;

  std::vector<Sequence> seqs;
  for (int64_t i = 0; i < b; ++i) {
    seqs.push_back({TextStream(tokenizer_, c.stop), false, {}});
    seqs.back().result.prompt_tokens = static_cast<int64_t>(encoded[i].size());
  }
  const int64_t allowed = std::min(tokenizer_.vocab_size(), model_->vocab_size());
  std::unique_ptr<DecodeGraphs> graphs;
  if (captured_decoding_ && device_.is_cuda() && max_new > 1) {
    if (const std::string why = DecodeGraphs::unsupported(*model_, device_); why.empty())
      graphs = std::make_unique<DecodeGraphs>(*model_, cache, pad, device_);
    else
      spdlog::debug("decoding without CUDA graphs: {}", why);
  }
  auto emit = [&](int64_t i, const std::string& piece) {
    if (on_text && !piece.empty()) on_text(static_cast<size_t>(i), piece);
  };

  for (int64_t step = 0; step < max_new; ++step) {
    at::Tensor next = sample_next(logits.to(at::kCPU), c, gen, allowed);   // [B]
    auto* nx = next.data_ptr<int64_t>();
    bool all_done = true;
    for (int64_t i = 0; i < b; ++i) {
      auto& s = seqs[i];
      if (s.done) continue;
      if (eos && nx[i] == *eos) {
        s.done = true;
        s.result.finish_reason = "eos";
        emit(i, s.text.finish_at_eos());
        continue;
      }
      emit(i, s.text.push(static_cast<int>(nx[i])));
      if (s.text.stopped()) {
        s.done = true;
        s.result.finish_reason = "stop";
        continue;
      }
      if (step + 1 == max_new) {
        s.done = true;
        s.result.finish_reason = "length";
        emit(i, s.text.finish_at_length());
        continue;
      }
      all_done = false;
    }
    if (all_done) break;
    // Finished sequences keep decoding a dummy token (cheaper than reshaping the batch mid-flight).
    ++timing_.decode_steps;
    if (graphs) {
      try {
        logits = graphs->step(next);
        ++timing_.captured_steps;
        timing_.captures = graphs->captures();
        continue;
      } catch (const std::exception& e) {   // the eager step below writes this step's key and value again
        spdlog::warn("decoding on without CUDA graphs: capturing a step failed ({})", e.what());
        graphs.reset();
      }
    }
    nn::ForwardOptions decode;
    decode.cache = &cache;
    decode.last_only = true;
    const int64_t at_pos = cache.length;
    if (ragged) {
      decode.positions = (at::full({b, 1}, at_pos, long_opts) - pad_t).to(device_);
      auto k = at::arange(at_pos + 1, long_opts).view({1, 1, 1, at_pos + 1});
      decode.mask = (k >= pad_t.view({b, 1, 1, 1})).to(device_);                      // [B, 1, 1, S]
    }
    logits = model_->forward(next.view({b, 1}).to(device_), decode).squeeze(1);
  }
  timing_.decode_s = lap();

  std::vector<GenerationResult> out;
  for (auto& s : seqs) {
    if (!s.done) s.result.finish_reason = "length";
    s.result.text = s.text.emitted();
    s.result.completion_tokens = static_cast<int64_t>(s.text.ids().size());
    out.push_back(std::move(s.result));
  }
  return out;
}

}  // namespace colossal
