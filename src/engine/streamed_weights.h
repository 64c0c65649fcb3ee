// StreamedWeights: generation with a model larger than memory (Colossal-AI's low-cost deployment
// through offload). The model is built with deferred parameters; its embeddings, final norm and head
// are read once and stay. The blocks' weights are converted once, block by block, into a cache file in
// our own layout (one contiguous region per block: no per-token transposes of HF's layouts) and each
// block's region is read back into one of two host buffers just before the block runs, the next
// block's read in flight (io_uring, src/memory/offload_file.h) while this block computes; after the
// last block, the first block's, for the next token. Two blocks' weights are in memory at most.
//
// The cache goes through the page cache when all blocks fit in half of this machine's memory (a model
// that fits is then read at memory speed after the first token) and O_DIRECT otherwise (a larger
// model must not fill the page cache with what it will read again only next token). The file has no
// name and goes with the process.
//
// A block hook (nn/block_hooks.h), so the model and the generator are unchanged: the same greedy tokens
// come out as from the model in memory.
#pragma once
#include <c10/core/Device.h>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "src/io/hf_weights.h"
#include "src/memory/offload_file.h"
#include "src/nn/block_hooks.h"
#include "src/nn/model.h"

namespace colossal {

class StreamedWeights : public nn::BlockHook {
 public:
  // `model` was built with nn::ParamStorage::deferred; the cache file goes in directory `cache_dir`.
  StreamedWeights(nn::Model& model, const HfWeights& weights, c10::Device device, const std::string& cache_dir);
  ~StreamedWeights() override;
  StreamedWeights(const StreamedWeights&) = delete;
  StreamedWeights& operator=(const StreamedWeights&) = delete;

  void before_forward(int64_t block) override;
  void after_forward(int64_t block) override;
  void stop();   // waits for the read in flight (the first block's, for a token that never comes)

  int64_t most_blocks_held() const { return most_held_; }   // blocks with weights in memory at once, at most
  int64_t blocks_read() const { return blocks_read_; }
  int64_t bytes_read() const { return file_->bytes_read(); }
  int64_t resident_bytes() const { return resident_bytes_; }   // the parameters kept outside the blocks
  int64_t cache_bytes() const { return file_->size(); }
  bool direct() const { return file_->direct(); }

 private:
  struct Param {
    at::Tensor tensor;   // the model's parameter
    int64_t offset = 0;  // bytes into its block's region
  };
  void read(int64_t block, int buffer);   // starts reading the block's region into buffers_[buffer]

  c10::Device device_;
  std::vector<std::vector<Param>> blocks_;
  std::vector<int64_t> region_offset_, region_bytes_;   // by block, in the cache file
  std::unique_ptr<memory::OffloadFile> file_;
  memory::AlignedBuffer buffers_[2];
  int64_t pending_block_ = -1;   // the block being read, into buffers_[pending_buffer_]
  int pending_buffer_ = 0;
  memory::OffloadFile::Ticket pending_ = 0;
  int64_t most_held_ = 0, resident_bytes_ = 0, blocks_read_ = 0;
};

}  // namespace colossal
