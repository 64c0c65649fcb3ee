// Model: what the engine knows of every model, whatever its task. Checkpoint IO, data parallelism,
// the optimizer and the trainer work on this; a task (src/tasks) reaches for the narrower interface it
// drives (CausalLM, MaskedLM, Classifier), so the engine never names a family.
#pragma once
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "src/core/error.h"
#include "src/nn/module.h"

#include "src/nn/hf_names.h"

namespace colossal::nn {

class TransformerBlock;
class BlockHooks;

class Model : public Module {
 public:
  // The initial value of parameter `name` (a key of named_parameters()), written into `value` (its
  // shape, fp32), drawing from LibTorch's default generator. init_weights and for_each_initial_value
  // call it for every parameter in named_parameters() order, so both draw the same numbers: a run whose
  // chunk store takes the values one tensor at a time (ZeRO-3) starts from the weights a plain run does.
  virtual void init_parameter(const std::string& name, const at::Tensor& value) const = 0;
  void init_weights();   // every parameter in place (they must be allocated)
  virtual const HfNameMap& hf_names() const = 0;
  virtual nlohmann::json hf_config() const = 0;          // config.json as transformers writes it

  int64_t parameter_count() const;
  std::string model_type() const;   // config.json's model_type ("gpt2", "bert", ...)

  // The transformer blocks in execution order (every family is embed -> blocks -> head; the blocks'
  // parameters are "blocks.<i>.*"): what ZeRO-3, recompute and the profiler wrap from outside.
  const std::vector<std::shared_ptr<TransformerBlock>>& blocks() const { return blocks_; }
  // The chain run_blocks puts around each block (null: none), assembled by the engine.
  void set_block_hooks(std::shared_ptr<const BlockHooks> hooks) { hooks_ = std::move(hooks); }
  const BlockHooks* block_hooks() const { return hooks_.get(); }

  // Pipeline parallelism places the parameters outside the blocks by these: the modules the embedding
  // reads (module paths, "wte" or "bert.word_embeddings") go to the first stage, every other one outside
  // the blocks to the last (the final norm, the head); a module both read (a tied embedding, whose
  // weight is also the head's) is also in tied_to_head, and both stages hold it. Empty: the family
  // cannot be cut into stages.
  virtual std::vector<std::string> embedding_modules() const { return {}; }
  virtual std::vector<std::string> tied_to_head() const { return {}; }

 protected:
  std::vector<std::shared_ptr<TransformerBlock>> blocks_;   // families fill it with add_blocks

 private:
  std::shared_ptr<const BlockHooks> hooks_;
};

// Each parameter's initial value, in named_parameters() order, handed to `take` in a fresh fp32 CPU
// tensor of its shape: what init_weights would write, one tensor at a time, for a model whose
// parameters are deferred (factory.h).
void for_each_initial_value(const Model& model, const std::function<void(const std::string& name, const at::Tensor& value)>& take);

// `model` as the interface T a task or tool drives (T::kWhat says what that is); an Error naming
// `user` and the model's type if it is not one.
template <class T>
T& model_as(Model& model, const std::string& user) {
  if (auto* t = dynamic_cast<T*>(&model)) return *t;
  throw Error(user + " needs " + T::kWhat + "; this " + model.model_type() + " model is not one");
}
template <class T>
std::shared_ptr<T> model_as(const std::shared_ptr<Model>& model, const std::string& user) {
  (void)model_as<T>(*model, user);
  return std::dynamic_pointer_cast<T>(model);
}

}  // namespace colossal::nn
