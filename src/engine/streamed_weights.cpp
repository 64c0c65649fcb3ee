// Streamed weights for generation: see streamed_weights.h.
#include "src/engine/streamed_weights.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <algorithm>
#include <cstring>
#include <map>

#include "src/core/device.h"
#include "src/core/error.h"
#include "src/engine/checkpoint.h"
#include "src/nn/block.h"
#include "src/nn/factory.h"

namespace colossal {
namespace {

constexpr int64_t kParamAlign = 64;   // each parameter's place in a block's region: cache-line aligned

int64_t align_up(int64_t n, int64_t a) { return (n + a - 1) / a * a; }

}  // namespace

StreamedWeights::StreamedWeights(nn::Model& model, const HfWeights& weights, c10::Device device, const std::string& cache_dir)
    : device_(device) {
  if (model.blocks().empty()) throw Error("streamed weights: the model has no blocks to stream");
  std::map<const void*, int64_t> block_of;
  for (size_t b = 0; b < model.blocks().size(); ++b)
    for (const auto& p : model.blocks()[b]->parameters()) block_of[p.unsafeGetTensorImpl()] = static_cast<int64_t>(b);
  blocks_.resize(model.blocks().size());
  std::map<std::string, at::Tensor> outside;
  std::map<std::string, std::pair<int64_t, size_t>> place;   // a block parameter's block and index
  for (const auto& item : model.named_parameters()) {
    auto it = block_of.find(item.value().unsafeGetTensorImpl());
    if (it == block_of.end()) {
      outside.emplace(item.key(), item.value());
      continue;
    }
    auto& params = blocks_[static_cast<size_t>(it->second)];
    place[item.key()] = {it->second, params.size()};
    params.push_back({item.value(), 0});
  }
  // Each block's region: its parameters one after another, fp32, in our layout.
  int64_t total = 0, largest = 0;
  for (auto& params : blocks_) {
    int64_t at = 0;
    for (auto& p : params) {
      p.offset = at;
      at = align_up(at + p.tensor.numel() * 4, kParamAlign);
    }
    region_offset_.push_back(total);
    region_bytes_.push_back(at);
    total += memory::io_round_up(at);
    largest = std::max(largest, at);
  }
  memory::OffloadFileOptions options;
  // Through the page cache while the blocks fit in half of what this process may hold (a job's or a
  // container's memory limit counts the cache too), else around it.
  options.direct = static_cast<double>(total) > 0.5 * static_cast<double>(usable_memory_bytes());
  file_ = std::make_unique<memory::OffloadFile>(cache_dir, total, "streamed weights cache in " + cache_dir, options);
  for (auto& b : buffers_) b = memory::AlignedBuffer(largest);

  // One pass over the checkpoint, in the model's order: the parameters outside the blocks stay; each
  // block's are held until the block is complete, then copied into buffer 0 and written to the cache.
  at::NoGradGuard no_grad;
  std::vector<size_t> missing(blocks_.size());
  for (size_t b = 0; b < blocks_.size(); ++b) missing[b] = blocks_[b].size();
  std::vector<std::vector<at::Tensor>> held(blocks_.size());   // values of blocks not yet complete
  auto write_block = [&](int64_t b) {
    const auto& params = blocks_[static_cast<size_t>(b)];
    for (size_t i = 0; i < params.size(); ++i) {
      const at::Tensor& v = held[static_cast<size_t>(b)][i];
      std::memcpy(buffers_[0].data() + params[i].offset, v.const_data_ptr<float>(), static_cast<size_t>(v.numel()) * 4);
    }
    held[static_cast<size_t>(b)].clear();
    file_->wait(file_->write(region_offset_[static_cast<size_t>(b)], buffers_[0].data(), region_bytes_[static_cast<size_t>(b)]));
  };
  read_model_state(model, weights, [&](const std::string& name, const at::Tensor& value) {
    if (auto it = outside.find(name); it != outside.end()) {
      it->second.set_data(value.to(device_));
      resident_bytes_ += static_cast<int64_t>(value.nbytes());
      return;
    }
    const auto [b, i] = place.at(name);
    auto& vals = held[static_cast<size_t>(b)];
    if (vals.empty()) vals.resize(blocks_[static_cast<size_t>(b)].size());
    vals[i] = value.contiguous();
    if (--missing[static_cast<size_t>(b)] == 0) write_block(b);
  });
  read(0, 0);   // the first block, for the first token
}

StreamedWeights::~StreamedWeights() { stop(); }

void StreamedWeights::stop() {
  if (pending_ != 0) file_->wait(pending_);
  pending_ = 0;
  pending_block_ = -1;
}

void StreamedWeights::read(int64_t block, int buffer) {
  pending_block_ = block;
  pending_buffer_ = buffer;
  pending_ = file_->read(region_offset_[static_cast<size_t>(block)], buffers_[buffer].data(), region_bytes_[static_cast<size_t>(block)]);
  ++blocks_read_;
}

void StreamedWeights::before_forward(int64_t block) {
  if (pending_block_ != block) {   // not the one read ahead (blocks ran out of order): read it now, into the same buffer
    stop();
    read(block, pending_buffer_);
  }
  const int buffer = pending_buffer_;
  stop();   // waits for the read: the block's weights are in buffers_[buffer]
  at::NoGradGuard no_grad;
  for (auto& p : blocks_[static_cast<size_t>(block)]) {
    at::Tensor view = buffers_[buffer].view(p.offset, p.tensor.numel(), at::kFloat).view(p.tensor.sizes());
    p.tensor.set_data(device_.is_cpu() ? view : view.to(device_));
  }
  // Measured, not counted: the blocks whose weights are in place now, plus the one about to be read.
  int64_t held = 0;
  for (const auto& ps : blocks_) held += !ps.empty() && !nn::is_unallocated(ps.front().tensor);
  most_held_ = std::max(most_held_, held + 1);
  read((block + 1) % static_cast<int64_t>(blocks_.size()), 1 - buffer);   // into the other buffer, while this block runs
}

void StreamedWeights::after_forward(int64_t block) {
  at::NoGradGuard no_grad;
  for (auto& p : blocks_[static_cast<size_t>(block)]) p.tensor.set_data(nn::unallocated_tensor(p.tensor.sizes()));
}

}  // namespace colossal
