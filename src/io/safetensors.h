// safetensors, written and read here: an 8-byte little-endian header length, a JSON header
// {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {str: str}}, then raw bytes.
// Readers validate everything against the file's real size before touching data, so a truncated or
// corrupt file is an Error naming the file, never a crash or a silently wrong tensor.
#pragma once
#include <ATen/core/Tensor.h>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace colossal {

struct NamedTensor {
  std::string name;
  at::Tensor tensor;
};

// Writes tensors (any CPU/GPU device, any strides; copied to contiguous CPU bytes) in the given
// order. The file is written whole to `path` (callers make it atomic at the directory level).
void save_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Writes a safetensors file one tensor at a time: the header (every tensor's name, dtype and shape, in
// file order) first, then each tensor's bytes as the caller produces them, in that order. Writing a
// checkpoint so holds one tensor beside the model, not a copy of the file's contents.
class SafetensorsWriter {
 public:
  struct Entry {
    std::string name;
    at::ScalarType dtype;
    std::vector<int64_t> shape;
  };
  SafetensorsWriter(std::string path, std::vector<Entry> entries, const std::map<std::string, std::string>& metadata = {});
  // The next entry's values (any device and strides); Error when it is not what the header promised.
  void write(const std::string& name, const at::Tensor& t);
  void finish();   // Error unless every entry was written; the file is whole after it

 private:
  std::string path_;
  std::vector<Entry> entries_;
  size_t next_ = 0;
  std::ofstream out_;
};

// "model-00002-of-00004.safetensors": transformers' name for shard 2 (index 1) of 4.
std::string safetensors_shard_name(const std::string& stem, int64_t index, int64_t count);

// A model's tensors as transformers' save_pretrained shards them, written one tensor at a time: files of
// at most `max_shard_bytes` each, cut between tensors (a tensor larger than that has a file of its own),
// in the entries' order. One file is `stem`.safetensors; more are safetensors_shard_name(stem, k, n)
// with `stem`.safetensors.index.json naming each tensor's file (written by finish). A writer so holds
// one tensor, never a file's contents: a model larger than memory is written as it is produced.
class ShardedSafetensorsWriter {
 public:
  ShardedSafetensorsWriter(const std::string& dir, const std::string& stem, std::vector<SafetensorsWriter::Entry> entries,
                           uint64_t max_shard_bytes, const std::map<std::string, std::string>& metadata = {});
  void write(const std::string& name, const at::Tensor& t);   // the next entry, as SafetensorsWriter::write
  void finish();
  const std::vector<std::string>& files() const { return files_; }

 private:
  std::string dir_, stem_;
  std::map<std::string, std::string> metadata_;
  std::vector<std::vector<SafetensorsWriter::Entry>> shards_;   // the entries of each file
  std::vector<std::string> files_;
  uint64_t total_bytes_ = 0;
  size_t shard_ = 0, written_ = 0;   // the file being written and how many of its entries are in it
  std::unique_ptr<SafetensorsWriter> out_;
};

struct SafetensorsFile {
  std::vector<NamedTensor> tensors;               // in file order, CPU, contiguous
  std::map<std::string, std::string> metadata;
  const at::Tensor& at(const std::string& name, const std::string& path) const;   // Error if missing
  bool contains(const std::string& name) const;
};

SafetensorsFile load_safetensors(const std::string& path);

// The same validation without reading the data: where each tensor lies, so a reader can take one
// tensor at a time (loading a model then holds one tensor beside its parameters, not a second copy).
struct SafetensorsEntry {
  std::string name;
  at::ScalarType dtype;
  std::vector<int64_t> shape;
  uint64_t offset = 0, bytes = 0;   // from the file's start
};
struct SafetensorsHeader {
  std::string path;
  std::vector<SafetensorsEntry> entries;   // in file order
  std::map<std::string, std::string> metadata;
};
SafetensorsHeader read_safetensors_header(const std::string& path);
at::Tensor read_safetensors_tensor(const SafetensorsHeader& header, const SafetensorsEntry& entry);
// The tensor as a read-only view of the file mapped into memory: only the pages a reader touches are
// read from the disk (a tensor-parallel rank's rows of a table). Must not be written.
at::Tensor map_safetensors_tensor(const SafetensorsHeader& header, const SafetensorsEntry& entry);
// Bytes [offset, offset + bytes) of the file at `path`, mapped read-only, as a uint8 tensor whose storage
// unmaps them when it goes; an Error naming `what` when the file cannot be opened or mapped.
at::Tensor map_file_bytes(const std::string& path, uint64_t offset, uint64_t bytes, const std::string& what);

}  // namespace colossal
