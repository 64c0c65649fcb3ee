// Causal LM task: see causal_lm.h.
#include "src/tasks/causal_lm.h"

#include <ATen/ATen.h>
#include <spdlog/spdlog.h>

#include "src/core/text.h"
#include "src/data/loader.h"
#include "src/data/prepare.h"
#include "src/data/token_dataset.h"
#include "src/data/tokenizer.h"
#include "src/nn/causal_lm.h"
#include "src/tasks/text_data.h"

namespace colossal {
namespace {

// A window of T+1 tokens as inputs [:, :T] predicting targets [:, 1:].
Batch next_token_batch(const at::Tensor& window) {
  const int64_t t = window.size(1) - 1;
  return Batch{window.narrow(1, 0, t), window.narrow(1, 1, t), {}, {}};
}

class CausalLmTask final : public Task {
 public:
  explicit CausalLmTask(TaskData data) : text_(std::move(data)) {}

  std::string name() const override { return "causal_lm"; }
  void check_data() const override { text_.check(); }
  void prepare_data() override { text_.prepare(); }
  void load_data() override {
    text_.load();
    const Recipe& r = text_.data().recipe;
    for (auto& b : eval_batches(text_.val_tokens(), r.train.batch_size, r.train.seq_len, r.train.eval_batches,
                                text_.data().dp_rank, text_.data().dp_size))
      eval_set_.push_back(next_token_batch(b));
    text_.warn_if_no_eval(eval_set_.empty());
  }
  std::string describe_data() const override { return text_.describe(); }
  TokenizerFiles tokenizer_files() const override { return text_.tokenizer().files(); }
  void check_model(nn::Model& model) const override { (void)nn::model_as<nn::CausalLM>(model, "the causal_lm task"); }

  void start(int64_t samples_seen) override { loader_ = text_.loader(text_.data().recipe.train.seq_len, samples_seen); }
  Batch next() override { return next_token_batch(loader_->next()); }
  int64_t position() const override { return loader_->position(); }

  at::Tensor loss(nn::Model& model, const Batch& b) override {
    return nn::model_as<nn::CausalLM>(model, "the causal_lm task").loss(b.inputs, b.targets, b.positions);
  }
  const std::vector<Batch>& eval_set() const override { return eval_set_; }
  EvalSums eval(nn::Model& model, const Batch& b) override { return {loss(model, b).item<double>(), 1, 0, 0}; }

 private:
  TextData text_;
  std::unique_ptr<WindowLoader> loader_;
  std::vector<Batch> eval_set_;
};

}  // namespace

std::unique_ptr<Task> make_causal_lm_task(TaskData data) { return std::make_unique<CausalLmTask>(std::move(data)); }

}  // namespace colossal
