// ChunkLayout: where each parameter lives in the chunk store. Parameters are packed in execution order
// (the model's registration order: embedding, each block, head) into chunks of equal size, so a block's
// tensors sit in one or two chunks and ZeRO moves a few large buffers instead of hundreds of small
// tensors. A tensor larger than the chunk size gets a chunk of its own. Every chunk is cut into one
// shard per data-parallel rank (ZeRO's unit of ownership); a tensor may straddle two shards.
//
// The chunk size is searched, as Colossal-AI's search_chunk_configuration does, over candidate sizes
// stepped through a range, keeping the one that wastes the fewest elements to padding (the tail of
// each chunk that the next tensor did not fit in). Lengths of runs of whole tensors join the
// candidates, so a chunk can be exactly a block or two long.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace colossal::memory {

struct ChunkTensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  bool decay = false;   // takes weight decay (matrices and embeddings; not biases and norms)
};

struct ChunkSlot {      // one tensor's place
  std::string name;
  std::vector<int64_t> shape;
  int64_t numel = 0;
  bool decay = false;
  int64_t chunk = 0, offset = 0;   // in elements, within the chunk
};

struct ChunkLayout {
  int64_t chunk_numel = 0;           // the common chunk size (a larger tensor's own chunk exceeds it, the last may be smaller)
  int64_t shards = 1;                // data-parallel ranks each chunk is cut across
  std::vector<int64_t> chunk_sizes;  // elements of each chunk, each a multiple of kAlign * shards
  std::vector<ChunkSlot> slots;      // in execution order
  std::vector<std::vector<int64_t>> chunk_slots;   // slot indices of each chunk

  int64_t chunks() const { return static_cast<int64_t>(chunk_sizes.size()); }
  int64_t shard_numel(int64_t chunk) const { return chunk_sizes[static_cast<size_t>(chunk)] / shards; }
  int64_t total_numel() const;       // every chunk, padding included
  int64_t padding() const;           // total_numel minus the parameters' elements
};

// Shards (and so chunks) are multiples of this many elements: 64 bytes of fp32, a cache line.
constexpr int64_t kAlign = 16;

// Packs `tensors` in order into chunks of `chunk_numel` elements (rounded up to a multiple of
// kAlign * shards). A tensor that does not fit in the current chunk's remainder opens the next; the
// last chunk is cut to what it holds.
ChunkLayout plan_chunks(const std::vector<ChunkTensorSpec>& tensors, int64_t chunk_numel, int64_t shards);

// The chunk size in [lo, hi] whose plan wastes the fewest elements, among sizes stepped by `step` and
// the lengths of runs of consecutive tensors (from the first 64) that fall in the range; ties go to the
// smaller size (finer-grained gathering).
int64_t search_chunk_numel(const std::vector<ChunkTensorSpec>& tensors, int64_t lo, int64_t hi, int64_t step, int64_t shards);

// The recipe's choice: `chunk_mb` > 0 is MiB of fp32 per chunk; 0 ("auto") searches a range scaled to the
// model, from 1/64 to 1/8 of its elements (the lower end from 64 Ki to 64 Mi elements, the upper end at
// most 256 Mi) in 128 steps, so a model is a few dozen chunks whatever its size. ZeRO-3 (`stage` 3) searches 1/64 to 1/32: what it holds
// beyond its shards (the chunks gathered around a block, the gradient chunks being reduced, the chunks a
// checkpoint gathers) is a few chunks, so smaller chunks are memory, where at 1/8 they were a quarter
// of the model and more.
int64_t choose_chunk_numel(const std::vector<ChunkTensorSpec>& tensors, double chunk_mb, int64_t shards, int stage = 0);

}  // namespace colossal::memory
