// StreamedWeights: generation with a model larger than memory (Colossal-AI's low-cost deployment
// through offload). The model is built with deferred parameters; its embeddings, final norm and head
// are read once and stay. Each block's weights are read into one of two host buffers just before the
// block runs, the next block's read in flight (io_uring, src/memory/offload_file.h) while this block
// computes; after the last block, the first block's, for the next token. Two blocks' weights are in
// memory at most.
//
// Where the blocks are read from:
// - in place, from the checkpoint's own safetensors files, when every block parameter lies there as
//   the model computes with it (parameters_stored_as_is: one tensor of its own type, fp32 or a quantized
//   layer's integers, at most transposed, as our GPT-2 and quantized checkpoints and HF's GPT-2
//   directories hold them) and each block's tensors lie together: one read per block and file (a
//   sharded checkpoint may cut a block in two), and no second copy of the model on the disk. A
//   transposed weight is a transposed view, which decoding multiplies by kernels::gemv_t (no copy);
// - otherwise from a cache file under cache_dir, written once in our own layout (one contiguous region
//   per block, converted from HF's layouts: OPT's separate q/k/v, BLOOM's interleaved heads, fp16 or
//   bf16 files). The file has no name and goes with the process.
// The reads go through the page cache when all blocks fit in half of the memory this process may hold
// (a model that fits is then read at memory speed after the first token) and O_DIRECT otherwise (a
// larger model must not fill the page cache with what it will read again only next token); StreamIo
// forces either. Through the page cache, a checkpoint read in place is mapped instead of read: each
// block's parameters view the mapping, and the next block's pages are asked for ahead (madvise), so no
// byte is copied (a read out of the checkpoint's cached pages cost twice the cache file's).
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

// Where a streamed model's blocks come from: in place where the checkpoint allows it, else the cache
// (automatic); only in place (an Error saying why not, when it cannot be); always through the cache.
enum class StreamSource { automatic, checkpoint, cache };
// "auto", "checkpoint" or "cache"; an Error naming the valid values otherwise.
StreamSource parse_stream_source(const std::string& name);
// How the blocks are read: by the memory rule above (automatic), always O_DIRECT, or always through the
// page cache (mapped, for a checkpoint read in place). "auto", "direct" or "page-cache".
enum class StreamIo { automatic, direct, page_cache };
StreamIo parse_stream_io(const std::string& name);

class StreamedWeights : public nn::BlockHook {
 public:
  // `model` was built with nn::ParamStorage::deferred; a cache file goes in directory `cache_dir`.
  StreamedWeights(nn::Model& model, const HfWeights& weights, c10::Device device, const std::string& cache_dir,
                  StreamSource source = StreamSource::automatic, StreamIo io = StreamIo::automatic);
  ~StreamedWeights() override;
  StreamedWeights(const StreamedWeights&) = delete;
  StreamedWeights& operator=(const StreamedWeights&) = delete;

  void before_forward(int64_t block) override;
  void after_forward(int64_t block) override;
  void stop();   // waits for the read in flight (the first block's, for a token that never comes)

  int64_t most_blocks_held() const { return most_held_; }   // blocks with weights in memory at once, at most
  int64_t blocks_read() const { return blocks_read_; }
  int64_t bytes_read() const;
  int64_t resident_bytes() const { return resident_bytes_; }   // the parameters kept outside the blocks
  int64_t block_bytes() const { return block_bytes_; }         // what one pass over the blocks reads
  bool in_place() const { return in_place_; }                  // read from the checkpoint's files, no cache
  int64_t cache_bytes() const { return in_place_ ? 0 : files_.front()->size(); }
  bool direct() const { return !mapped_ && files_.front()->direct(); }
  bool mapped() const { return mapped_; }   // the checkpoint's files mapped, the blocks viewed there

 private:
  struct Param {
    std::string name;
    at::Tensor tensor;             // the model's parameter
    int64_t offset = 0;            // bytes into its block's buffer
    std::vector<int64_t> shape;    // as it lies there: ours, or ours transposed when `transpose`
    bool transpose = false;
    size_t piece = 0;              // in place: which of its block's pieces holds it
  };
  // Where part of a block's bytes are: files_[file] from `offset` (aligned), `bytes` long, read into the
  // block's buffer at `at` (aligned). A block is one piece, or one per file where a sharded checkpoint
  // splits it (transformers cuts shards between tensors, not between blocks).
  struct Piece {
    size_t file = 0;
    int64_t offset = 0, bytes = 0, at = 0;
  };
  // The in-place plan (pieces_ and the parameters' places), or why the checkpoint does not allow one.
  std::string plan_in_place(const nn::Model& model, const HfWeights& weights, std::vector<std::string>& paths);
  void plan_cache();   // one piece a block in a cache file of our own layout
  void read(int64_t block, int buffer);   // starts reading the block's pieces into buffers_[buffer] (mapped: asks for their pages)

  c10::Device device_;
  std::vector<std::vector<Param>> blocks_;
  std::vector<std::vector<Piece>> pieces_;   // by block
  std::vector<std::unique_ptr<memory::OffloadFile>> files_;   // the checkpoint's files read in place, or the one cache
  std::vector<std::vector<at::Tensor>> mapped_pieces_;   // or, by block, its pieces mapped (src/io/safetensors.h)
  bool in_place_ = false, mapped_ = false;
  int64_t mapped_bytes_ = 0;   // bytes of the blocks viewed in the mapping so far
  int64_t block_bytes_ = 0;
  memory::AlignedBuffer buffers_[2];
  int64_t pending_block_ = -1;   // the block being read, into buffers_[pending_buffer_]
  int pending_buffer_ = 0;
  std::vector<std::pair<size_t, memory::OffloadFile::Ticket>> pending_;   // its pieces' reads: file, ticket
  int64_t most_held_ = 0, resident_bytes_ = 0, blocks_read_ = 0;
};

// A StreamedWeights for `model`, installed as the model's block hook (whose chain then holds it too):
// how infer and quantize run a model whose blocks stay on the disk. stop() it before the model goes.
std::shared_ptr<StreamedWeights> stream_blocks(nn::Model& model, const HfWeights& weights, c10::Device device,
                                               const std::string& cache_dir, StreamSource source = StreamSource::automatic,
                                               StreamIo io = StreamIo::automatic);

}  // namespace colossal
