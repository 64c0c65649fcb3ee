// Reading HF weight directories: see hf_weights.h.
#include "src/io/hf_weights.h"

#include <ATen/ATen.h>
#include <algorithm>
#include <filesystem>
#include <optional>
#include <torch/csrc/jit/serialization/pickle.h>

#include "src/core/error.h"
#include "src/core/json_value.h"
#include "src/io/atomic_dir.h"

namespace fs = std::filesystem;

namespace colossal {
namespace {

bool is_bin(const std::string& path) { return path.size() > 4 && path.substr(path.size() - 4) == ".bin"; }

// The shard files an index names, in first-mention order; each must sit beside the index.
std::vector<std::string> shard_files(const std::string& index_path, std::map<std::string, std::string>& owner,
                                     std::map<std::string, std::string>& metadata) {
  const nlohmann::json j = parse_json(read_text_file(index_path), "weights index " + index_path);
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    throw Error("weights index " + index_path + ": has no \"weight_map\" object (expected {\"weight_map\": {tensor: file}})");
  if (j.contains("metadata") && j["metadata"].is_object())
    for (const auto& [key, value] : j["metadata"].items())
      if (value.is_string()) metadata[key] = value.get<std::string>();
  std::vector<std::string> files;
  for (const auto& [name, file] : j["weight_map"].items()) {
    if (!file.is_string() || file.get<std::string>().empty() || file.get<std::string>().find('/') != std::string::npos)
      throw Error("weights index " + index_path + ": tensor \"" + name + "\" maps to " + file.dump() +
                  " (expected the name of a file beside the index)");
    const std::string f = file.get<std::string>();
    owner[name] = f;
    if (std::find(files.begin(), files.end(), f) == files.end()) files.push_back(f);
  }
  return files;
}

uint64_t little_endian(const std::string& b, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(b[at + static_cast<size_t>(i)]);
  return v;
}

// torch.save writes a zip archive. LibTorch's reader hands miniz a memory reader that copies whatever
// range it is asked for, so a truncated or damaged archive whose central directory points past the
// end made it read beyond the buffer (AddressSanitizer found it on a half-length shard). The end
// record, and its zip64 form, must sit at the end and place the central directory inside the file.
void check_zip_layout(const std::string& b, const std::string& path) {
  auto damaged = [&](const std::string& why) {
    return Error("weights file " + path + ": not a readable torch.save archive (truncated or damaged: " + why + ")");
  };
  constexpr size_t kEnd = 22;   // the end-of-central-directory record without its comment
  if (b.size() < kEnd) throw damaged(std::to_string(b.size()) + " bytes is shorter than a zip archive's end record");
  std::optional<size_t> end;
  const size_t lowest = b.size() >= kEnd + 65535 ? b.size() - kEnd - 65535 : 0;
  for (size_t at = b.size() - kEnd + 1; at-- > lowest;)
    if (little_endian(b, at, 4) == 0x06054b50 && at + kEnd + little_endian(b, at + 20, 2) == b.size()) {
      end = at;
      break;
    }
  if (!end) throw damaged("no end-of-central-directory record at the end of its " + std::to_string(b.size()) + " bytes");
  uint64_t dir_size = little_endian(b, *end + 12, 4), dir_offset = little_endian(b, *end + 16, 4), dir_end = *end;
  if (dir_size == 0xFFFFFFFF || dir_offset == 0xFFFFFFFF) {   // zip64: the locator sits just before the end record
    if (*end < 20 || little_endian(b, *end - 20, 4) != 0x07064b50) throw damaged("zip64 sizes without a zip64 locator");
    const uint64_t record = little_endian(b, *end - 20 + 8, 8);
    if (record > *end - 20 || *end - 20 - record < 56 || little_endian(b, record, 4) != 0x06064b50)
      throw damaged("the zip64 end record is not where its locator says");
    dir_size = little_endian(b, record + 40, 8);
    dir_offset = little_endian(b, record + 48, 8);
    dir_end = record;
  }
  if (dir_offset > dir_end || dir_size > dir_end - dir_offset)
    throw damaged("its central directory (" + std::to_string(dir_size) + " bytes at " + std::to_string(dir_offset) +
                  ") lies outside the " + std::to_string(b.size()) + " bytes");
}

}  // namespace

std::vector<NamedTensor> load_torch_state_dict(const std::string& path) {
  const std::string text = read_text_file(path);
  check_zip_layout(text, path);
  const std::vector<char> bytes(text.begin(), text.end());   // the form pickle_load takes
  c10::IValue value;
  try {
    value = torch::jit::pickle_load(bytes);
  } catch (const std::exception& e) {
    std::string why = e.what();
    why = why.substr(0, why.find('\n'));
    throw Error("weights file " + path + ": not a readable torch.save archive (" + why + ")");
  }
  if (!value.isGenericDict()) throw Error("weights file " + path + ": holds a " + value.tagKind() + ", not a state dict");
  std::vector<NamedTensor> out;
  for (const auto& item : value.toGenericDict()) {
    if (!item.key().isString() || !item.value().isTensor())
      throw Error("weights file " + path + ": entry " + (item.key().isString() ? "\"" + item.key().toStringRef() + "\"" : "?") +
                  " is not a named tensor");
    out.push_back({item.key().toStringRef(), item.value().toTensor().contiguous()});
  }
  return out;
}

void HfWeights::add(const std::string& name, Entry entry) {
  if (auto it = tensors_.find(name); it != tensors_.end())
    throw Error("weights " + entry.file + ": tensor \"" + name + "\" is also in " + it->second.file);
  tensors_.emplace(name, std::move(entry));
  order_.push_back(name);
}

std::map<std::string, std::string> HfWeights::add_safetensors(const std::string& path, const std::function<void(const std::string&)>& check) {
  auto header = std::make_shared<const SafetensorsHeader>(read_safetensors_header(path));
  for (size_t i = 0; i < header->entries.size(); ++i) {
    const std::string& name = header->entries[i].name;
    if (check) check(name);
    add(name, Entry{{}, path, header, i});
  }
  return header->metadata;
}

HfWeights HfWeights::from_file(SafetensorsFile file, const std::string& path) {
  HfWeights w;
  w.description_ = path;
  for (auto& [name, t] : file.tensors) w.add(name, Entry{std::move(t), path, nullptr, 0});
  return w;
}

HfWeights HfWeights::open(const std::string& dir) { return open(dir, "model"); }

HfWeights HfWeights::open(const std::string& dir, const std::string& stem) {
  const fs::path d(dir);
  HfWeights w;
  const bool model = stem == "model";
  std::vector<std::string> singles{stem + ".safetensors"}, indexes{stem + ".safetensors.index.json"};
  if (model) {
    singles.push_back("pytorch_model.bin");
    indexes.push_back("pytorch_model.bin.index.json");
  }
  for (const auto& single : singles) {
    const std::string path = (d / single).string();
    if (!fs::is_regular_file(path)) continue;
    w.description_ = path;
    if (is_bin(path)) {
      for (auto& [name, t] : load_torch_state_dict(path)) w.add(name, Entry{std::move(t), path, nullptr, 0});
    } else {
      w.metadata_ = w.add_safetensors(path);
    }
    return w;
  }
  for (const auto& index : indexes) {
    const std::string path = (d / index).string();
    if (!fs::is_regular_file(path)) continue;
    std::map<std::string, std::string> owner;
    const auto files = shard_files(path, owner, w.metadata_);
    w.description_ = path + " (" + std::to_string(files.size()) + " shard" + (files.size() == 1 ? ")" : "s)");
    for (const auto& f : files) {
      const std::string shard = (d / f).string();
      if (!fs::is_regular_file(shard)) throw Error("weights index " + path + ": shard " + f + " is missing");
      auto listed = [&](const std::string& name) {
        auto it = owner.find(name);
        if (it == owner.end() || it->second != f)
          throw Error("weights " + shard + ": tensor \"" + name + "\" is not listed for this shard in " + path);
      };
      if (is_bin(shard)) {
        for (auto& [name, t] : load_torch_state_dict(shard)) {
          listed(name);
          w.add(name, Entry{std::move(t), shard, nullptr, 0});
        }
      } else {
        w.add_safetensors(shard, listed);
      }
    }
    for (const auto& [name, f] : owner)
      if (!w.contains(name)) throw Error("weights " + (d / f).string() + ": tensor \"" + name + "\" listed in " + path + " is missing");
    return w;
  }
  if (!model)
    throw Error("checkpoint " + dir + ": no " + stem + " state (expected " + singles[0] + " or " + indexes[0] + ")");
  throw Error("model directory " + dir + ": no weights (expected model.safetensors, model.safetensors.index.json, "
              "pytorch_model.bin or pytorch_model.bin.index.json)");
}

bool HfWeights::contains(const std::string& name) const { return tensors_.count(name) > 0; }

at::Tensor HfWeights::get(const std::string& name) const {
  if (mapped_reads_) return map(name);
  auto it = tensors_.find(name);
  if (it == tensors_.end()) throw Error("weights " + description_ + ": tensor \"" + name + "\" is missing");
  const Entry& e = it->second;
  return e.header ? read_safetensors_tensor(*e.header, e.header->entries[e.index]) : e.tensor;
}

at::Tensor HfWeights::map(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) throw Error("weights " + description_ + ": tensor \"" + name + "\" is missing");
  const Entry& e = it->second;
  return e.header ? map_safetensors_tensor(*e.header, e.header->entries[e.index]) : e.tensor;
}

const SafetensorsEntry* HfWeights::entry(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() || !it->second.header ? nullptr : &it->second.header->entries[it->second.index];
}

const std::string& HfWeights::file_of(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? description_ : it->second.file;
}

}  // namespace colossal
