// CausalLM: the interface of a decoder-only language model (the causal_lm task and generation drive
// it). Every model is embed -> blocks[] -> head; pipeline stages, ZeRO-3 gathering, recompute and
// profiling will wrap the blocks from outside, so the interface exposes the parts as well as the
// whole forward.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <functional>
#include <optional>
#include <nlohmann/json.hpp>
#include <vector>

#include "src/nn/attention.h"
#include "src/nn/block.h"
#include "src/nn/block_hooks.h"
#include "src/nn/hf_names.h"
#include "src/nn/model.h"

namespace colossal::nn {

// Keys and values of every layer, for generation. `length` positions are filled.
struct KvCache {
  std::vector<LayerKv> layers;
  int64_t length = 0;
  int64_t capacity = 0;
};

struct ForwardOptions {
  KvCache* cache = nullptr;   // read and extended when given (generation)
  at::Tensor positions;       // [B, T] position ids; default: cache length + arange(T)
  at::Tensor mask;            // bool [B, 1, T, S]; default: causal
  bool last_only = false;     // compute logits for the last position only (generation)
};

// An empty cache of `layers` layers of [batch, heads, capacity, head_dim] keys and values.
KvCache make_kv_cache(int64_t layers, int64_t batch, int64_t heads, int64_t capacity, int64_t head_dim,
                      const at::TensorOptions& options);

// Position ids of the ids [B, T] a forward receives: options.positions, or cache length + arange(T);
// a sequence reaching past `context` positions is refused.
at::Tensor positions_of(const at::Tensor& ids, const ForwardOptions& options, int64_t context);
// x [B, T, C] through `blocks`, reading and extending options.cache (one layer per block) and applying
// options.mask. With `hooks` (the model's block_hooks()), each block runs inside the chain; with a
// pipeline stage in the chain, only the stage's blocks run (stage_port.h). `embed` computes x: called
// only where the blocks start from the embedding (not on a later pipeline stage).
at::Tensor run_blocks(const std::vector<std::shared_ptr<TransformerBlock>>& blocks, const std::function<at::Tensor()>& embed,
                      const ForwardOptions& options, const BlockHooks* hooks = nullptr);
inline at::Tensor run_blocks(const std::vector<std::shared_ptr<TransformerBlock>>& blocks, const at::Tensor& x,
                             const ForwardOptions& options, const BlockHooks* hooks = nullptr) {
  return run_blocks(blocks, [&x] { return x; }, options, hooks);
}

class CausalLM : public Model {
 public:
  static constexpr const char* kWhat = "a causal language model (a decoder-only family)";

  // ids [B, T] int64 -> final hidden states [B, T, C] (after the last norm), ready for the head.
  virtual at::Tensor features(const at::Tensor& ids, const ForwardOptions& options = {}) = 0;
  virtual at::Tensor head_weight() = 0;   // [V, C] (the token embedding when tied)
  // The token embedding when the head is tied to it (its project() gives the logits, also when it holds
  // integers); null when the head is a weight of its own.
  virtual Embedding* tied_head() { return nullptr; }
  // x [..., C] -> logits [..., V].
  at::Tensor head_logits(const at::Tensor& x);

  // ids [B, T] -> logits [B, T, V] (or [B, 1, V] with last_only).
  at::Tensor forward(const at::Tensor& ids, const ForwardOptions& options = {});
  // Mean next-token cross entropy of ids[:, t] predicting targets[:, t], through the fused
  // head + loss (no logits-sized log-probabilities are ever stored). `positions` [T]: where the tokens
  // sit in their sequences (a sequence-parallel rank's share); undefined: 0 .. T-1.
  at::Tensor loss(const at::Tensor& ids, const at::Tensor& targets, const at::Tensor& positions = {});

  // A cache's tensors hold the compute dtype, or kv_dtype where one is set.
  virtual KvCache make_cache(int64_t batch, int64_t capacity, const c10::Device& device) const = 0;
  virtual int64_t context_length() const = 0;
  virtual int64_t vocab_size() const = 0;

  // What the KV caches this model makes (make_cache, and serving's pools built from it) store: a dtype
  // narrower than the compute dtype cuts the bytes a decoding step reads from its cache and the memory a
  // sequence holds (half in 16 bits, about a quarter in int8 rows: kernels/cpu/kv_element.h); nullopt
  // (the default) keeps the compute dtype.
  void set_kv_dtype(std::optional<at::ScalarType> dtype) { kv_dtype_ = dtype; }
  std::optional<at::ScalarType> kv_dtype() const { return kv_dtype_; }

 protected:
  // The options of a cache on `device` for a model computing in `compute`.
  at::TensorOptions cache_options(const c10::Device& device, at::ScalarType compute) const {
    return at::TensorOptions().device(device).dtype(kv_dtype_.value_or(compute));
  }

 private:
  std::optional<at::ScalarType> kv_dtype_;
};

}  // namespace colossal::nn
