// StreamedWeights: generation with a model larger than memory (Colossal-AI's low-cost deployment
// through offload). The model is built with deferred parameters; its embeddings, final norm and head
// are read once, and each block's tensors are read from the checkpoint's safetensors files just before
// the block runs and dropped after it, the next block's read running on an I/O thread while this block
// computes (after the last block, the first block's, for the next token). At most two blocks' weights
// are in memory at once: the running one and the one being read.
//
// A block hook (nn/block_hooks.h), so the model and the generator are unchanged: the same greedy
// tokens come out as from the model in memory, each token paying one read of every block.
#pragma once
#include <c10/core/Device.h>
#include <atomic>
#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "src/io/hf_weights.h"
#include "src/nn/block_hooks.h"
#include "src/nn/model.h"

namespace colossal {

class StreamedWeights : public nn::BlockHook {
 public:
  // `model` was built with nn::ParamStorage::deferred; `weights` stays open for the hook's life.
  StreamedWeights(nn::Model& model, std::shared_ptr<const HfWeights> weights, c10::Device device);
  ~StreamedWeights() override;   // waits for a read in flight
  StreamedWeights(const StreamedWeights&) = delete;
  StreamedWeights& operator=(const StreamedWeights&) = delete;

  void before_forward(int64_t block) override;
  void after_forward(int64_t block) override;

  int64_t most_blocks_held() const { return most_held_; }   // blocks with weights in memory at once, at most
  int64_t blocks_read() const { return blocks_read_; }
  int64_t bytes_read() const { return bytes_read_; }
  int64_t resident_bytes() const { return resident_bytes_; }   // the parameters kept outside the blocks

 private:
  std::vector<at::Tensor> read_block(int64_t block);
  void prefetch(int64_t block);

  nn::Model& model_;
  std::shared_ptr<const HfWeights> weights_;
  c10::Device device_;
  std::vector<std::vector<std::pair<std::string, at::Tensor>>> block_params_;   // by block: name, parameter
  std::future<std::vector<at::Tensor>> next_;
  int64_t next_block_ = -1;   // what next_ is reading
  int64_t most_held_ = 0, resident_bytes_ = 0;
  std::atomic<int64_t> blocks_read_{0}, bytes_read_{0};
};

}  // namespace colossal
