// HfWeights: the tensors of a Hugging Face model directory, however save_pretrained stored them:
// model.safetensors, a sharded model.safetensors.index.json, or the older pytorch_model.bin (a
// torch.save zip archive, read with LibTorch's pickle loader) and its sharded index. Every tensor
// remembers the file it came from, so errors name the file and the tensor.
#pragma once
#include <ATen/core/Tensor.h>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "src/io/safetensors.h"

namespace colossal {

class HfWeights {
 public:
  // Error naming `dir` and the files looked for when none is there, or the file and tensor at fault.
  static HfWeights open(const std::string& dir);
  // The same for another set of tensors written like a model's: <stem>.safetensors, or
  // <stem>.safetensors.index.json and its shards (our optimizer states: stem "optimizer").
  static HfWeights open(const std::string& dir, const std::string& stem);
  // One safetensors file already read (our checkpoints, tests).
  static HfWeights from_file(SafetensorsFile file, const std::string& path);

  const std::vector<std::string>& names() const { return order_; }   // in file order, shard by shard
  bool contains(const std::string& name) const;
  // The tensor, read from its file now when it is in a safetensors file (the caller copies it into
  // place and lets it go, so loading never holds a second copy of the model); Error naming the files
  // when missing.
  at::Tensor get(const std::string& name) const;
  // get() then maps a safetensors tensor (as map) instead of reading it into fresh memory: a reader that
  // converts each tensor at once and lets it go (the block-at-a-time quantizer) saves the kernel's copy
  // out of the page cache and the zeroing of a new buffer per tensor, 12% of quantizing a model larger
  // than memory. Not the default: a file truncated under a mapping ends the process (SIGBUS) where a
  // read is an Error.
  void set_mapped_reads(bool on) { mapped_reads_ = on; }
  // The same, mapped rather than read when it is in a safetensors file (read-only: only what the caller
  // touches is read; see map_safetensors_tensor).
  at::Tensor map(const std::string& name) const;
  const std::string& file_of(const std::string& name) const;
  // Where the tensor's bytes lie when it is in a safetensors file (its entry: dtype, shape, byte range
  // from the file's start), so a reader can take them straight from the disk; null when it was read
  // whole into memory (pytorch_model.bin) or is missing.
  const SafetensorsEntry* entry(const std::string& name) const;
  const std::string& describe() const { return description_; }   // "<dir>/model.safetensors" or "<index> (3 shards)"
  // The single file's metadata, or the string values of the index's "metadata" object.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  struct Entry {
    at::Tensor tensor;   // held (pytorch_model.bin, from_file), or undefined: read from `header`
    std::string file;
    std::shared_ptr<const SafetensorsHeader> header;
    size_t index = 0;
  };
  void add(const std::string& name, Entry entry);
  // Every tensor of a safetensors file, read later by get(); `check` may refuse a name. Returns the
  // file's metadata.
  std::map<std::string, std::string> add_safetensors(const std::string& path, const std::function<void(const std::string&)>& check = {});
  std::map<std::string, Entry> tensors_;
  std::vector<std::string> order_;
  std::string description_;
  std::map<std::string, std::string> metadata_;
  bool mapped_reads_ = false;
};

// A pytorch_model.bin state dict (name -> tensor), CPU and contiguous. Error naming `path` if the
// file is not a torch.save archive of a dict of tensors.
std::vector<NamedTensor> load_torch_state_dict(const std::string& path);

}  // namespace colossal
