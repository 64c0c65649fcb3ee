// Continuous batching over the paged KV cache: see batch_engine.h.
#include "src/serve/batch_engine.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <algorithm>

#include "src/core/error.h"

namespace colossal::serve {

struct BatchEngine::Sequence {
  int64_t id = 0;
  EngineRequest request;
  std::vector<int> tokens;       // prompt, then every generated token
  int64_t prompt_tokens = 0;
  int64_t computed = 0;          // positions whose keys and values are in the cache
  std::vector<int32_t> blocks;   // block table
  TextStream text;
  at::Generator generator;
  bool done = false;
  Sequence(const Tokenizer& tok, EngineRequest r)
      : request(std::move(r)), text(tok, request.sampling.stop),
        generator(at::make_generator<at::CPUGeneratorImpl>(request.sampling.seed)) {}
  int64_t generated() const { return static_cast<int64_t>(tokens.size()) - prompt_tokens; }
  int64_t pending() const { return static_cast<int64_t>(tokens.size()) - computed; }
};

BatchEngine::BatchEngine(std::shared_ptr<nn::CausalLM> model, const Tokenizer& tokenizer, EngineConfig config)
    : model_(std::move(model)), tokenizer_(tokenizer), config_(config), blocks_(*model_, config.num_blocks, config.block_size, config.device) {
  if (config.max_step_tokens < 1 || config.max_running < 1)
    throw Error("serving engine: max_step_tokens and max_running must be at least 1");
  allowed_vocab_ = std::min(tokenizer_.vocab_size(), model_->vocab_size());
  eos_ = tokenizer_.end_of_text();
  model_->eval();
  stats_.blocks_total = blocks_.total();
}

BatchEngine::~BatchEngine() = default;

int64_t BatchEngine::submit(EngineRequest r) {
  const int64_t context = model_->context_length(), n = static_cast<int64_t>(r.prompt.size());
  if (n == 0) throw Error("the prompt has no tokens");
  if (n >= context)
    throw Error("the prompt has " + std::to_string(n) + " tokens but the model's context is " + std::to_string(context) +
                " (at most " + std::to_string(context - 1) + " leave room for a completion)");
  if (r.sampling.max_tokens < 1) throw Error("max_tokens must be at least 1");
  const int64_t longest = std::min<int64_t>(n + r.sampling.max_tokens, context);
  if (blocks_.blocks_for(longest) > blocks_.total())
    throw Error("the prompt and its completion need " + std::to_string(blocks_.blocks_for(longest)) + " KV blocks but the pool has " +
                std::to_string(blocks_.total()) + " (lower max_tokens or give the server more KV memory)");
  auto s = std::make_unique<Sequence>(tokenizer_, std::move(r));
  s->tokens = s->request.prompt;
  s->prompt_tokens = n;
  std::lock_guard lock(inbox_mutex_);
  s->id = next_id_++;
  inbox_.push_back(std::move(s));
  return inbox_.back()->id;
}

void BatchEngine::cancel(int64_t id) {
  std::lock_guard lock(inbox_mutex_);
  cancelled_.push_back(id);
}

EngineStats BatchEngine::stats() const {
  std::lock_guard lock(inbox_mutex_);
  EngineStats s = stats_;
  s.waiting += static_cast<int64_t>(inbox_.size());
  return s;
}

void BatchEngine::finish(Sequence& s, const std::string& reason) {
  if (s.done) return;
  s.done = true;
  blocks_.release(s.blocks);
  if (reason == "length") {   // the bytes held back for a character still incomplete: the completion's too
    const std::string rest = s.text.finish_at_length();
    if (!rest.empty() && s.request.on_text) s.request.on_text(rest);
  }
  Completion c;
  c.text = s.text.emitted();
  c.ids = s.text.ids();
  c.prompt_tokens = s.prompt_tokens;
  c.finish_reason = reason;
  if (s.request.on_done) s.request.on_done(c);
}

void BatchEngine::admit_inbox() {
  std::vector<std::unique_ptr<Sequence>> arrived;
  std::vector<int64_t> cancelled;
  {
    std::lock_guard lock(inbox_mutex_);
    arrived.swap(inbox_);
    cancelled.swap(cancelled_);
  }
  for (auto& s : arrived) waiting_.push_back(std::move(s));
  for (int64_t id : cancelled) {
    for (auto& s : waiting_)
      if (s->id == id) finish(*s, "cancelled");
    for (auto& s : running_)
      if (s->id == id) finish(*s, "cancelled");
  }
  std::erase_if(waiting_, [](const auto& s) { return s->done; });
  running_.remove_if([](const auto& s) { return s->done; });
}

void BatchEngine::preempt(Sequence& s) {
  blocks_.release(s.blocks);
  s.computed = 0;   // recomputed from its tokens (prompt and what it generated) when it runs again
  ++stats_.preemptions;
}

// Picks this step's rows: each chosen sequence with the number of its pending tokens it computes now.
bool BatchEngine::schedule(std::vector<Sequence*>& rows, std::vector<int64_t>& counts) {
  int64_t budget = config_.max_step_tokens;
  // 1. Decoding sequences, one token each, oldest first; a missing block preempts the newest other one.
  for (auto it = running_.begin(); it != running_.end() && budget > 0;) {
    Sequence& s = **it;
    if (s.computed == 0 || s.pending() != 1) {
      ++it;
      continue;
    }
    while (!blocks_.grow(s.blocks, s.computed + 1)) {
      auto victim = std::prev(running_.end());
      if (victim == it) break;   // no one newer to take blocks from
      preempt(**victim);
      waiting_.push_front(std::move(*victim));
      running_.erase(victim);
    }
    if (s.blocks.size() * blocks_.block_size() < static_cast<size_t>(s.computed + 1)) {   // alone and still short
      preempt(s);
      waiting_.push_front(std::move(*it));
      it = running_.erase(it);
      continue;
    }
    rows.push_back(&s);
    counts.push_back(1);
    --budget;
    ++it;
  }
  // 2. Prompt chunks: running sequences still prefilling, then waiting ones (admitted while blocks last).
  auto chunk = [&](Sequence& s) -> int64_t {
    int64_t n = std::min(s.pending(), budget);
    const int64_t room = (static_cast<int64_t>(s.blocks.size()) + blocks_.free()) * blocks_.block_size() - s.computed;
    n = std::min(n, room);
    if (n <= 0 || !blocks_.grow(s.blocks, s.computed + n)) return 0;
    rows.push_back(&s);
    counts.push_back(n);
    budget -= n;
    return n;
  };
  for (auto& s : running_) {
    if (budget <= 0) break;
    if (s->computed == 0 || s->pending() > 1) chunk(*s);
  }
  while (budget > 0 && !waiting_.empty() && static_cast<int64_t>(running_.size()) < config_.max_running) {
    if (chunk(*waiting_.front()) == 0) break;
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
  return !rows.empty();
}

void BatchEngine::after_forward(Sequence& s, const at::Tensor& logits) {
  SamplingConfig c = s.request.sampling;
  const int next = static_cast<int>(sample_next(logits.view({1, -1}), c, s.generator, allowed_vocab_).item<int64_t>());
  if (eos_ && next == *eos_) {
    if (s.request.on_text) {
      const std::string rest = s.text.finish_at_eos();
      if (!rest.empty()) s.request.on_text(rest);
    }
    finish(s, "stop");
    return;
  }
  s.tokens.push_back(next);
  ++stats_.tokens_generated;
  if (s.request.on_token) {
    TokenEvent e;
    e.id = next;
    if (s.request.logprobs >= 0) {
      const at::Tensor lp = logits.narrow(0, 0, allowed_vocab_).to(at::kFloat).log_softmax(0);
      e.logprob = lp[next].item<float>();
      if (s.request.logprobs > 0) {
        const auto [values, ids] = lp.topk(std::min<int64_t>(s.request.logprobs, allowed_vocab_));
        for (int64_t k = 0; k < values.size(0); ++k) e.top.emplace_back(static_cast<int>(ids[k].item<int64_t>()), values[k].item<float>());
      }
    }
    s.request.on_token(e);
  }
  const std::string piece = s.text.push(next);
  if (!piece.empty() && s.request.on_text) s.request.on_text(piece);
  if (s.text.stopped()) finish(s, "stop");
  else if (s.generated() >= c.max_tokens || static_cast<int64_t>(s.tokens.size()) >= model_->context_length()) finish(s, "length");
}

bool BatchEngine::step() {
  admit_inbox();
  std::vector<Sequence*> rows;
  std::vector<int64_t> counts;
  if (!schedule(rows, counts)) {
    refresh_stats();
    if (mirror_) mirror_->idle();   // the other tensor-parallel ranks wait on
    return false;
  }

  // The ragged batch: every scheduled token a row of its own, at its position, with its table.
  StepPlan plan;
  std::vector<Sequence*> sampled;
  for (size_t r = 0; r < rows.size(); ++r) {
    Sequence& s = *rows[r];
    plan.tables.push_back(s.blocks);   // once a sequence, however many of its tokens run
    for (int64_t k = 0; k < counts[r]; ++k) {
      const int64_t pos = s.computed + k;
      plan.ids.push_back(s.tokens[static_cast<size_t>(pos)]);
      plan.positions.push_back(pos);
      plan.table_of.push_back(static_cast<int64_t>(r));
    }
    if (s.pending() > 1 || s.computed == 0) stats_.prompt_tokens += counts[r];   // a prompt chunk (or a recomputation)
    s.computed += counts[r];
    if (s.pending() == 0) {   // its last token is in: its logits give the next one
      plan.logit_rows.push_back(static_cast<int64_t>(plan.ids.size()) - 1);
      sampled.push_back(&s);
    }
  }
  const auto n = static_cast<int64_t>(plan.ids.size());
  if (mirror_) mirror_->send(plan);   // the other ranks run the same forward on their pieces
  const at::Tensor logits = forward_plan(*model_, blocks_, plan);   // [M, V]
  for (size_t i = 0; i < sampled.size(); ++i) after_forward(*sampled[i], logits[static_cast<int64_t>(i)]);
  running_.remove_if([](const auto& s) { return s->done; });
  ++stats_.steps;
  stats_.last_step_tokens = n;
  stats_.last_step_sequences = static_cast<int64_t>(rows.size());
  refresh_stats();
  return true;
}

void BatchEngine::refresh_stats() {
  std::lock_guard lock(inbox_mutex_);   // stats() reads them from other threads
  stats_.running = static_cast<int64_t>(running_.size());
  stats_.waiting = static_cast<int64_t>(waiting_.size());
  stats_.blocks_used = blocks_.used();
}

}  // namespace colossal::serve
