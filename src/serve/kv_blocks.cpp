// The paged KV cache's block pool: see kv_blocks.h.
#include "src/serve/kv_blocks.h"

#include <ATen/ATen.h>

#include "src/core/error.h"

namespace colossal::serve {

KvBlocks::KvBlocks(const nn::CausalLM& model, int64_t num_blocks, int64_t block_size) : block_size_(block_size) {
  if (num_blocks < 1 || block_size < 1)
    throw Error("KV cache: " + std::to_string(num_blocks) + " blocks of " + std::to_string(block_size) + " positions (both must be at least 1)");
  const auto probe = model.make_cache(1, 1, c10::Device(c10::kCPU));   // the layers' heads and head size
  for (const auto& layer : probe.layers) {
    const int64_t heads = layer.k.size(1), head_dim = layer.k.size(3);
    k_.push_back(at::zeros({num_blocks, heads, block_size, head_dim}));
    v_.push_back(at::zeros({num_blocks, heads, block_size, head_dim}));
    bytes_per_block_ += 2 * heads * block_size * head_dim * static_cast<int64_t>(sizeof(float));
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
