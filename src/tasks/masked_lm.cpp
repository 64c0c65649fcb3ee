// Masked LM task: see masked_lm.h.
#include "src/tasks/masked_lm.h"

#include <ATen/ATen.h>

#include "src/core/error.h"
#include "src/data/loader.h"
#include "src/data/mlm_masking.h"
#include "src/nn/encoder.h"
#include "src/tasks/text_data.h"

namespace colossal {
namespace {

constexpr int64_t kWrap = 2;                   // [CLS] and [SEP] around each window
constexpr uint64_t kEvalStream = 0x6576616cULL;   // eval masks: a stream of their own, fixed per batch

nn::MaskedLM& masked_lm(nn::Model& model) { return nn::model_as<nn::MaskedLM>(model, "the masked_lm task"); }

class MaskedLmTask final : public Task {
 public:
  explicit MaskedLmTask(TaskData data) : text_(std::move(data)) {}

  std::string name() const override { return "masked_lm"; }
  void check_data() const override {
    text_.check();
    if (seq_len() < kWrap + 2)
      throw RecipeError(text_.data().recipe.where("train.seq_len"), "= " + std::to_string(seq_len()) + " is too short for masked LM (valid: at least 4: [CLS], two tokens, [SEP])");
  }
  void prepare_data() override { text_.prepare(); }
  void load_data() override {
    text_.load();
    spec_ = spec_of(text_.tokenizer(), text_.data().tokenizer_path);
    const Recipe& r = text_.data().recipe;
    const auto windows = eval_batches(text_.val_tokens(), r.train.batch_size, window_tokens() - 1, r.train.eval_batches,
                                      text_.data().dp_rank, text_.data().dp_size);
    const auto eval_seed = static_cast<uint64_t>(r.train.seed) ^ kEvalStream, rank = static_cast<uint64_t>(text_.data().dp_rank);
    for (size_t i = 0; i < windows.size(); ++i)
      eval_set_.push_back(masked(windows[i], [&](int64_t row) {
        return batch_seed(eval_seed, i * static_cast<uint64_t>(r.train.batch_size) + static_cast<uint64_t>(row), rank);
      }));
    text_.warn_if_no_eval(eval_set_.empty());
  }
  std::string describe_data() const override { return text_.describe(); }
  TokenizerFiles tokenizer_files() const override { return text_.tokenizer().files(); }
  void check_model(nn::Model& model) const override { (void)masked_lm(model); }

  // The loader cuts windows of length + 1 tokens: ask for the text of one sequence less the wrap.
  void start(int64_t samples_seen) override { loader_ = text_.loader(window_tokens() - 1, samples_seen); }
  Batch next() override {
    // Each sample's mask follows from its index in the global sample stream (rank r of W holds
    // samples [r*B, (r+1)*B) of each global batch, as the loader cuts them), so a resumed run, with
    // the same or another number of data-parallel ranks, masks every sample as an uninterrupted run.
    const Recipe& r = text_.data().recipe;
    const int64_t first = loader_->position() + text_.data().dp_rank * r.train.batch_size;
    return masked(loader_->next(), [&](int64_t row) {
      return batch_seed(static_cast<uint64_t>(r.train.seed), static_cast<uint64_t>(first + row), 0);
    });
  }
  int64_t position() const override { return loader_->position(); }

  at::Tensor loss(nn::Model& model, const Batch& b) override {
    auto [logits, labels] = scored_logits(masked_lm(model), b);
    // The mean over every part's masked positions, times the parts (the engine averages the parts'
    // losses and gradients): each part masks a different number of positions. The loss in fp32
    // whatever the model computes in.
    const double global = global_count_(static_cast<double>(labels.numel()));
    if (global == 0) return logits.sum() * 0.0;   // nothing masked anywhere: no gradient, on every rank alike
    return at::cross_entropy_loss(logits.to(at::kFloat), labels, {}, at::Reduction::Sum) * (parts_ / global);
  }
  const std::vector<Batch>& eval_set() const override { return eval_set_; }
  EvalSums eval(nn::Model& model, const Batch& b) override {
    auto [logits, labels] = scored_logits(masked_lm(model), b);
    const double correct = logits.argmax(-1).eq(labels).sum().item<double>();
    return {at::cross_entropy_loss(logits.to(at::kFloat), labels).item<double>(), 1, correct, static_cast<double>(labels.numel())};
  }
  bool has_accuracy() const override { return true; }

 private:
  int64_t seq_len() const {
    const Recipe& r = text_.data().recipe;
    return r.train.seq_len ? r.train.seq_len : r.model.block_size;
  }
  int64_t window_tokens() const { return seq_len() - kWrap; }

  static MlmSpec spec_of(const Tokenizer& tok, const std::string& path) {
    MlmSpec s;
    auto need = [&](const char* role) {
      if (auto id = tok.role_id(role)) return *id;
      throw Error("tokenizer " + path + " has no " + role + " token; the masked_lm task needs [CLS], [SEP] and [MASK] (a BERT vocab.txt or tokenizer.json, e.g. data/kjv/bert-wordpiece-4096)");
    };
    s.cls = need("cls"), s.sep = need("sep"), s.mask = need("mask");
    for (const char* role : {"pad", "unk", "bos", "eos"})   // and cls, sep: the document separator is eos or sep
      if (auto id = tok.role_id(role)) s.specials.push_back(*id);
    s.vocab_size = tok.vocab_size();
    return s;
  }

  // Windows [B, L] masked row by row, row i from the generator seeded by seed_of(i).
  template <class SeedOf>
  Batch masked(const at::Tensor& windows, const SeedOf& seed_of) const {
    std::vector<at::Tensor> inputs, labels;
    for (int64_t i = 0; i < windows.size(0); ++i) {
      auto m = mask_tokens(windows.narrow(0, i, 1), spec_, seed_of(i));
      inputs.push_back(m.inputs);
      labels.push_back(m.labels);
    }
    return Batch{at::cat(inputs), at::cat(labels), {}, {}};
  }

  // The MLM head on the scored positions only: logits [N, V] and their labels [N].
  static std::pair<at::Tensor, at::Tensor> scored_logits(nn::MaskedLM& m, const Batch& b) {
    const at::Tensor h = m.encode({b.inputs, b.token_types, b.attention_mask, b.positions});   // [B, T, C]
    const at::Tensor flat = b.targets.reshape({-1});
    const at::Tensor scored = flat.ge(0).nonzero().squeeze(1);
    return {m.mlm_logits(h.reshape({-1, h.size(-1)}).index_select(0, scored)), flat.index_select(0, scored)};
  }

  TextData text_;
  MlmSpec spec_;
  std::unique_ptr<WindowLoader> loader_;
  std::vector<Batch> eval_set_;
};

}  // namespace

std::unique_ptr<Task> make_masked_lm_task(TaskData data) { return std::make_unique<MaskedLmTask>(std::move(data)); }

}  // namespace colossal
