// Chunk store: see chunk_store.h.
#include "src/memory/chunk_store.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "src/core/error.h"

namespace colossal::memory {

std::vector<ChunkTensorSpec> chunk_specs(nn::Module& module) {
  std::vector<ChunkTensorSpec> specs;
  for (auto& item : module.named_parameters()) {
    if (!item.value().requires_grad()) continue;
    specs.push_back({item.key(), item.value().sizes().vec(), item.value().dim() >= 2});
  }
  return specs;
}

ChunkStore::ChunkStore(nn::Module& module, int stage, int64_t chunk_numel, int64_t shards, int64_t rank)
    : stage_(stage), rank_(stage == 0 ? 0 : rank) {
  if (stage < 0 || stage > 2) throw Error("chunk store: ZeRO stage " + std::to_string(stage) + " (internal: 0, 1 or 2 here)");
  const auto specs = chunk_specs(module);
  if (specs.empty()) throw Error("chunk store: the model has no trainable parameters");
  layout_ = plan_chunks(specs, chunk_numel, stage == 0 ? 1 : shards);
  std::map<std::string, at::Tensor> by_name;
  for (auto& item : module.named_parameters()) by_name[item.key()] = item.value();
  const at::Tensor& first = by_name.at(specs.front().name);
  const auto options = first.options();
  at::NoGradGuard no_grad;
  for (int64_t c = 0; c < layout_.chunks(); ++c) {
    const int64_t size = layout_.chunk_sizes[static_cast<size_t>(c)];
    params_.push_back(at::zeros({size}, options));   // padding stays zero
    if (stage_ <= 1) full_grads_.push_back(at::zeros({size}, options));
    if (stage_ == 0) grad_shards_.push_back(full_grads_.back());
    if (stage_ == 1) grad_shards_.push_back(full_grads_.back().narrow(0, shard_begin(c), shard_numel(c)));
    if (stage_ == 2) grad_shards_.push_back(at::zeros({shard_numel(c)}, options));
  }
  for (const auto& slot : layout_.slots) {
    at::Tensor p = by_name.at(slot.name);
    if (p.scalar_type() != first.scalar_type() || p.device() != first.device())
      throw Error("chunk store: parameter \"" + slot.name + "\" is " + c10::toString(p.scalar_type()) + " on " + p.device().str() +
                  ", the first is " + c10::toString(first.scalar_type()) + " on " + first.device().str() + " (one dtype and device per model)");
    auto view = params_[static_cast<size_t>(slot.chunk)].narrow(0, slot.offset, slot.numel).view(p.sizes());
    view.copy_(p);
    p.set_data(view);
    if (stage_ <= 1) p.mutable_grad() = full_grads_[static_cast<size_t>(slot.chunk)].narrow(0, slot.offset, slot.numel).view(p.sizes());
    tensors_.push_back(p);
    states_.push_back(TensorState::hold);
  }
}

int64_t ChunkStore::shard_begin(int64_t chunk) const { return stage_ == 0 ? 0 : rank_ * layout_.shard_numel(chunk); }
int64_t ChunkStore::shard_numel(int64_t chunk) const { return layout_.shard_numel(chunk); }

int64_t ChunkStore::owner(int64_t slot) const {
  if (stage_ == 0) return 0;
  const auto& s = layout_.slots[static_cast<size_t>(slot)];
  return s.offset / layout_.shard_numel(s.chunk);
}

std::vector<at::Tensor>& ChunkStore::state(const std::string& name) {
  auto [it, added] = optimizer_states_.try_emplace(name);
  if (added)
    for (int64_t c = 0; c < layout_.chunks(); ++c) it->second.push_back(at::zeros({shard_numel(c)}, params_.front().options()));
  return it->second;
}

std::vector<optim::ParamPiece> ChunkStore::pieces(const std::vector<std::string>& state_names, double weight_decay) {
  std::vector<std::vector<at::Tensor>*> states;
  for (const auto& n : state_names) states.push_back(&state(n));
  std::vector<optim::ParamPiece> out;
  for (int64_t c = 0; c < layout_.chunks(); ++c) {
    const int64_t lo = shard_begin(c), hi = lo + shard_numel(c);
    for (int64_t i : layout_.chunk_slots[static_cast<size_t>(c)]) {
      const auto& s = layout_.slots[static_cast<size_t>(i)];
      const int64_t a = std::max(lo, s.offset), b = std::min(hi, s.offset + s.numel);
      if (a >= b) continue;
      optim::ParamPiece piece;
      piece.param = params_[static_cast<size_t>(c)].narrow(0, a, b - a);
      piece.grad = grad_shards_[static_cast<size_t>(c)].narrow(0, a - lo, b - a);
      for (auto* st : states) piece.state.push_back((*st)[static_cast<size_t>(c)].narrow(0, a - lo, b - a));
      piece.weight_decay = s.decay ? weight_decay : 0.0;
      piece.tensor = i;
      out.push_back(std::move(piece));
    }
  }
  return out;
}

ChunkBytes ChunkStore::bytes() const {
  ChunkBytes b;
  for (const auto& t : params_) b.params += static_cast<int64_t>(t.nbytes());
  for (const auto& t : full_grads_) b.grads += static_cast<int64_t>(t.nbytes());
  if (stage_ == 2)
    for (const auto& t : grad_shards_) b.grads += static_cast<int64_t>(t.nbytes());
  for (const auto& [n, shards] : optimizer_states_)
    for (const auto& t : shards) b.optimizer += static_cast<int64_t>(t.nbytes());
  return b;
}

}  // namespace colossal::memory
