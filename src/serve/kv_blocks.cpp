// The paged KV cache's block pool: see kv_blocks.h.
#include "src/serve/kv_blocks.h"

#include <ATen/ATen.h>

#include "src/core/error.h"

namespace colossal::serve {

int64_t KvBlocks::block_bytes(const nn::CausalLM& model, int64_t block_size) {
  int64_t bytes = 0;
  for (const auto& layer : model.make_cache(1, 1, c10::Device(c10::kCPU)).layers)   // the layers' heads and head size
    bytes += 2 * layer.k.size(1) * block_size * layer.k.size(3) * static_cast<int64_t>(layer.k.element_size());
  return bytes;
}

KvBlocks::KvBlocks(const nn::CausalLM& model, int64_t num_blocks, int64_t block_size, c10::Device device)
    : block_size_(block_size), bytes_per_block_(block_bytes(model, block_size)), device_(device) {
  if (num_blocks < 1 || block_size < 1)
    throw Error("KV cache: " + std::to_string(num_blocks) + " blocks of " + std::to_string(block_size) + " positions (both must be at least 1)");
  for (const auto& layer : model.make_cache(1, 1, c10::Device(c10::kCPU)).layers) {
    const auto options = layer.k.options().device(device);
    k_.push_back(at::zeros({num_blocks, layer.k.size(1), block_size, layer.k.size(3)}, options));
    v_.push_back(at::zeros({num_blocks, layer.k.size(1), block_size, layer.k.size(3)}, options));
  }
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

bool KvBlocks::grow(std::vector<int32_t>& table, int64_t positions) {
  const int64_t need = blocks_for(positions) - static_cast<int64_t>(table.size());
  if (need <= 0) return true;
  if (need > free()) return false;
  for (int64_t i = 0; i < need; ++i) {
    table.push_back(free_.back());
    free_.pop_back();
  }
  return true;
}

void KvBlocks::release(std::vector<int32_t>& table) {
  for (auto it = table.rbegin(); it != table.rend(); ++it) free_.push_back(*it);
  table.clear();
}

nn::KvCache KvBlocks::cache_for(const nn::PagedRows& rows) const {
  nn::KvCache cache;
  for (size_t l = 0; l < k_.size(); ++l) cache.layers.push_back({k_[l], v_[l], &rows});
  return cache;
}

}  // namespace colossal::serve
