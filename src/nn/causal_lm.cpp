// CausalLM shared behaviour: see causal_lm.h.
#include "src/nn/causal_lm.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <stdexcept>

#include "src/nn/factory.h"
#include "src/nn/kv_storage.h"

#include "src/nn/linear_forward.h"
#include "src/nn/lm_head_loss.h"

namespace colossal::nn {

at::Tensor CausalLM::forward(const at::Tensor& ids, const ForwardOptions& options) {
  auto x = features(ids, options);                                   // [B, T, C]
  if (options.last_only) x = x.narrow(1, x.size(1) - 1, 1);
  return head_logits(x);                                             // [B, T, V]
}

at::Tensor CausalLM::head_logits(const at::Tensor& x) {
  if (auto* e = tied_head()) return e->project(x);
  return linear_forward(x, head_weight());
}

at::Tensor CausalLM::loss(const at::Tensor& ids, const at::Tensor& targets, const at::Tensor& positions) {
  auto x = features(ids, {.positions = positions});                  // [B, T, C]
  const at::Tensor w = head_weight();
  if (!at::isFloatingType(w.scalar_type()))   // a quantized head (inference only): its logits, then ATen's loss
    return at::cross_entropy_loss(head_logits(x).flatten(0, -2).to(at::kFloat), targets.reshape({-1}), {}, at::Reduction::Mean, -100);
  if (auto* e = tied_head()) return e->head_cross_entropy(x.reshape({-1, x.size(-1)}), targets.reshape({-1}));
  return lm_head_cross_entropy(x.reshape({-1, x.size(-1)}), w, targets.reshape({-1}));
}

KvCache make_kv_cache(int64_t layers, int64_t batch, int64_t heads, int64_t capacity, int64_t head_dim,
                      const at::TensorOptions& options) {
  KvCache cache;
  cache.capacity = capacity;
  const int64_t width = kv_row_width(head_dim, options.dtype().toScalarType());   // int8 rows carry their scales
  for (int64_t i = 0; i < layers; ++i)
    cache.layers.push_back({at::empty({batch, heads, capacity, width}, options), at::empty({batch, heads, capacity, width}, options)});
  return cache;
}

at::Tensor positions_of(const at::Tensor& ids, const ForwardOptions& o, int64_t context) {
  const int64_t t = ids.size(1), offset = o.cache ? o.cache->length : 0;
  TORCH_CHECK(offset + t <= context, "sequence of ", offset + t, " positions exceeds the context of ", context);
  return o.positions.defined() ? o.positions : at::arange(offset, offset + t, ids.options().dtype(at::kLong));
}

at::Tensor run_blocks(const std::vector<std::shared_ptr<TransformerBlock>>& blocks, const std::function<at::Tensor()>& embed,
                      const ForwardOptions& o, const BlockHooks* hooks) {
  const int64_t offset = o.cache ? o.cache->length : 0;
  StagePort* stage = hooks ? hooks->stage() : nullptr;
  const bool enter = !stage || stage->first, leave = !stage || stage->last;
  at::Tensor x = enter ? embed() : stage->input;   // a later stage's input is already in the blocks' layout
  if (enter && !blocks.empty()) x = blocks.front()->stream().enter_blocks(x);
  const size_t begin = stage ? static_cast<size_t>(stage->begin) : 0, end = stage ? static_cast<size_t>(stage->end) : blocks.size();
  for (size_t i = begin; i < end; ++i) {
    // by value: a recomputed block's forward runs again in backward (recompute.h)
    auto block = [b = blocks[i], kv = o.cache ? &o.cache->layers[i] : nullptr, offset, mask = o.mask](const at::Tensor& in) {
      return b->forward(in, kv, offset, mask);
    };
    x = hooks && !hooks->empty() ? hooks->run(static_cast<int64_t>(i), x, block) : block(x);
  }
  if (!leave) {
    stage->output = x;
    throw StageExit{};
  }
  if (!blocks.empty()) x = blocks.front()->stream().leave_blocks(x);
  if (o.cache) o.cache->length += x.size(1);
  return x;
}

std::string Model::model_type() const {
  const auto config = hf_config();
  return config.contains("model_type") && config["model_type"].is_string() ? config["model_type"].get<std::string>() : "unnamed";
}

void Model::init_weights() {
  at::NoGradGuard no_grad;
  for (auto& item : named_parameters()) {
    if (is_unallocated(item.value()))
      throw std::logic_error("init_weights: parameter \"" + item.key() + "\" is deferred (the chunk store initialises it)");
    // Drawn whole and cut, so a tensor-parallel rank's piece is what one process would have there.
    const ShardSpec& shard = item.shard();
    if (!shard.split()) {
      init_parameter(item.key(), item.value());
      continue;
    }
    const at::Tensor whole = at::empty(shard.full_shape(item.value().sizes()), item.value().options());
    init_parameter(item.key(), whole);
    item.value().copy_(shard.local_of(whole));
  }
}

void for_each_initial_value(const Model& model, const std::function<void(const std::string&, const at::Tensor&)>& take) {
  at::NoGradGuard no_grad;
  for (const auto& item : model.named_parameters()) {
    const ShardSpec& shard = item.shard();   // whole tensors are drawn, a split layer takes its piece
    const at::Tensor value = at::empty(shard.full_shape(item.value().sizes()), at::kFloat);
    model.init_parameter(item.key(), value);
    take(item.key(), shard.local_of(value));
  }
}

int64_t Model::parameter_count() const {
  int64_t n = 0;
  for (const auto& p : parameters()) n += p.numel();
  return n;
}

}  // namespace colossal::nn
