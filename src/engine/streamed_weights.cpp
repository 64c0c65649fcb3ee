// Streamed weights for generation: see streamed_weights.h.
#include "src/engine/streamed_weights.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <map>

#include "src/core/error.h"
#include "src/engine/checkpoint.h"
#include "src/nn/block.h"
#include "src/nn/factory.h"

namespace colossal {

StreamedWeights::StreamedWeights(nn::Model& model, std::shared_ptr<const HfWeights> weights, c10::Device device)
    : model_(model), weights_(std::move(weights)), device_(device) {
  if (model.blocks().empty()) throw Error("streamed weights: the model has no blocks to stream");
  std::map<const void*, int64_t> block_of;
  for (size_t b = 0; b < model.blocks().size(); ++b)
    for (const auto& p : model.blocks()[b]->parameters()) block_of[p.unsafeGetTensorImpl()] = static_cast<int64_t>(b);
  block_params_.resize(model.blocks().size());
  std::map<std::string, at::Tensor> outside;
  for (const auto& item : model.named_parameters()) {
    auto it = block_of.find(item.value().unsafeGetTensorImpl());
    if (it == block_of.end()) outside.emplace(item.key(), item.value());
    else block_params_[static_cast<size_t>(it->second)].emplace_back(item.key(), item.value());
  }
  // The parameters outside the blocks (embeddings, final norm, head) stay for the whole run.
  at::NoGradGuard no_grad;
  read_model_state(
      model, *weights_,
      [&](const std::string& name, const at::Tensor& value) {
        outside.at(name).set_data(value.to(device_));
        resident_bytes_ += static_cast<int64_t>(value.nbytes());
      },
      [&](const std::string& name) { return outside.count(name) > 0; });
}

StreamedWeights::~StreamedWeights() {
  if (next_.valid()) next_.wait();
}

std::vector<at::Tensor> StreamedWeights::read_block(int64_t block) {
  const auto& params = block_params_[static_cast<size_t>(block)];
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < params.size(); ++i) index.emplace(params[i].first, i);
  std::vector<at::Tensor> values(params.size());
  at::NoGradGuard no_grad;
  read_model_state(
      model_, *weights_,
      [&](const std::string& name, const at::Tensor& value) {
        values[index.at(name)] = value;
        bytes_read_ += static_cast<int64_t>(value.nbytes());
      },
      [&](const std::string& name) { return index.count(name) > 0; });
  ++blocks_read_;
  return values;
}

void StreamedWeights::prefetch(int64_t block) {
  next_block_ = block;
  next_ = std::async(std::launch::async, [this, block] { return read_block(block); });
}

void StreamedWeights::before_forward(int64_t block) {
  std::vector<at::Tensor> values;
  if (next_.valid() && next_block_ == block) {
    values = next_.get();   // rethrows a failed read
  } else {
    if (next_.valid()) next_.wait();   // read for another block (blocks ran out of order): dropped
    next_ = {};
    values = read_block(block);
  }
  at::NoGradGuard no_grad;
  auto& params = block_params_[static_cast<size_t>(block)];
  for (size_t i = 0; i < params.size(); ++i) params[i].second.set_data(values[i].to(device_));
  // Measured, not counted: the blocks whose weights are in place now, plus the one being read.
  int64_t held = 0;
  for (const auto& ps : block_params_) held += !ps.empty() && !nn::is_unallocated(ps.front().second);
  most_held_ = std::max(most_held_, held + 1);
  prefetch((block + 1) % static_cast<int64_t>(block_params_.size()));
}

void StreamedWeights::after_forward(int64_t block) {
  at::NoGradGuard no_grad;
  for (auto& [name, p] : block_params_[static_cast<size_t>(block)]) p.set_data(nn::unallocated_tensor(p.sizes()));
}

}  // namespace colossal
