// KvBlocks: the serving KV cache, paged. Every layer's keys and values live in one pool of fixed-size
// blocks ([num_blocks, H, block_size, D] per layer), and a sequence holds a table of the blocks its
// positions fill, taking one more each time it crosses a block boundary and giving all back when it
// finishes or is preempted, so memory follows the tokens actually held (vLLM's PagedAttention).
#pragma once
#include <ATen/core/Tensor.h>
#include <cstdint>
#include <vector>

#include "src/nn/causal_lm.h"

namespace colossal::serve {

class KvBlocks {
 public:
  // A pool of `num_blocks` blocks of `block_size` positions for every layer of `model`, in the model's
  // compute dtype on `device` (where the model runs).
  KvBlocks(const nn::CausalLM& model, int64_t num_blocks, int64_t block_size, c10::Device device = c10::Device(c10::kCPU));
  c10::Device device() const { return device_; }

  int64_t block_size() const { return block_size_; }
  int64_t total() const { return static_cast<int64_t>(k_.size() ? k_[0].size(0) : 0); }
  int64_t free() const { return static_cast<int64_t>(free_.size()); }
  int64_t used() const { return total() - free(); }
  int64_t bytes_per_block() const { return bytes_per_block_; }
  // What one block of `block_size` positions takes for every layer of `model` (keys and values, in its dtype).
  static int64_t block_bytes(const nn::CausalLM& model, int64_t block_size);
  // Blocks a sequence needs to hold `positions` positions.
  int64_t blocks_for(int64_t positions) const { return (positions + block_size_ - 1) / block_size_; }

  // Appends blocks to `table` until it covers `positions` positions; false (and nothing taken) when the
  // pool has too few free.
  bool grow(std::vector<int32_t>& table, int64_t positions);
  void release(std::vector<int32_t>& table);   // gives every block back and empties the table

  // The model's cache over the pool for one step whose rows are `rows` (layers' k, v and the rows).
  nn::KvCache cache_for(const nn::PagedRows& rows) const;

 private:
  int64_t block_size_ = 16, bytes_per_block_ = 0;
  c10::Device device_;
  std::vector<at::Tensor> k_, v_;   // per layer
  std::vector<int32_t> free_;       // a stack: the most recently freed block is reused first (warm in cache)
};

}  // namespace colossal::serve
