// safetensors reader and writer: see safetensors.h.
#include "src/io/safetensors.h"

#include <ATen/ATen.h>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <cerrno>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "src/core/error.h"
#include "src/core/json_value.h"
#include "src/core/text.h"

namespace colossal {
namespace {

struct DtypeName {
  at::ScalarType type;
  const char* name;
};
constexpr DtypeName kDtypes[] = {
    {at::kFloat, "F32"}, {at::kDouble, "F64"}, {at::kHalf, "F16"}, {at::kBFloat16, "BF16"},
    {at::kLong, "I64"},  {at::kInt, "I32"},    {at::kShort, "I16"}, {at::kChar, "I8"},
    {at::kByte, "U8"},   {at::kBool, "BOOL"},
};

// "2183456 bytes (2.08 MiB)": exact, since two sizes that differ can round to the same figure.
std::string exact_bytes(uint64_t n) { return std::to_string(n) + " bytes (" + human_bytes(static_cast<double>(n)) + ")"; }

uint64_t entry_bytes(const SafetensorsWriter::Entry& e) {
  uint64_t bytes = c10::elementSize(e.dtype);
  for (int64_t d : e.shape) bytes *= static_cast<uint64_t>(d);
  return bytes;
}

const char* dtype_name(at::ScalarType t) {
  for (const auto& d : kDtypes)
    if (d.type == t) return d.name;
  throw Error(std::string("safetensors: cannot store dtype ") + c10::toString(t));
}

}  // namespace

SafetensorsWriter::SafetensorsWriter(std::string path, std::vector<Entry> entries, const std::map<std::string, std::string>& metadata)
    : path_(std::move(path)), entries_(std::move(entries)) {
  nlohmann::ordered_json header;
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& e : entries_) {
    if (header.contains(e.name)) throw Error("safetensors " + path_ + ": duplicate tensor name \"" + e.name + "\"");
    const uint64_t bytes = entry_bytes(e);
    header[e.name] = {{"dtype", dtype_name(e.dtype)}, {"shape", e.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');   // keeps the data section 8-byte aligned
  out_.open(path_, std::ios::binary | std::ios::trunc);
  if (!out_) throw Error("cannot write " + path_ + ": " + std::strerror(errno));
  uint64_t n = json.size();
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  out_.write(reinterpret_cast<const char*>(len), 8);
  out_.write(json.data(), static_cast<std::streamsize>(json.size()));
}

void SafetensorsWriter::write(const std::string& name, const at::Tensor& t) {
  if (next_ >= entries_.size() || entries_[next_].name != name || entries_[next_].dtype != t.scalar_type() ||
      t.sizes() != c10::IntArrayRef(entries_[next_].shape))
    throw Error("safetensors " + path_ + ": tensor \"" + name + "\" (" + c10::toString(t.scalar_type()) + " " + c10::str(t.sizes()) +
                ") is not the next one its header lists (internal)");
  const at::Tensor c = t.detach().to(at::kCPU).contiguous();
  out_.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.numel() * c.element_size()));
  if (!out_) throw Error("cannot write " + path_ + ": " + std::strerror(errno) + " (disk full?)");
  ++next_;
}

void SafetensorsWriter::finish() {
  if (next_ != entries_.size())
    throw Error("safetensors " + path_ + ": " + std::to_string(entries_.size() - next_) + " tensor(s) of its header never written (internal)");
  out_.flush();
  if (!out_) throw Error("cannot write " + path_ + ": " + std::strerror(errno) + " (disk full?)");
  out_.close();
}

std::string safetensors_shard_name(const std::string& stem, int64_t index, int64_t count) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "-%05lld-of-%05lld.safetensors", static_cast<long long>(index + 1), static_cast<long long>(count));
  return stem + buf;
}

ShardedSafetensorsWriter::ShardedSafetensorsWriter(const std::string& dir, const std::string& stem,
                                                   std::vector<SafetensorsWriter::Entry> entries, uint64_t max_shard_bytes,
                                                   const std::map<std::string, std::string>& metadata)
    : dir_(dir), stem_(stem), metadata_(metadata) {
  uint64_t in_shard = 0;
  for (auto& e : entries) {
    const uint64_t bytes = entry_bytes(e);
    if (shards_.empty() || (in_shard > 0 && in_shard + bytes > max_shard_bytes)) {
      shards_.emplace_back();
      in_shard = 0;
    }
    in_shard += bytes;
    total_bytes_ += bytes;
    shards_.back().push_back(std::move(e));
  }
  if (shards_.empty()) shards_.emplace_back();
  const auto n = static_cast<int64_t>(shards_.size());
  for (int64_t k = 0; k < n; ++k) files_.push_back(n == 1 ? stem + ".safetensors" : safetensors_shard_name(stem, k, n));
  out_ = std::make_unique<SafetensorsWriter>(dir_ + "/" + files_[0], shards_[0], metadata_);
}

void ShardedSafetensorsWriter::write(const std::string& name, const at::Tensor& t) {
  while (written_ == shards_[shard_].size() && shard_ + 1 < shards_.size()) {   // this file is whole: the next one
    out_->finish();
    ++shard_;
    written_ = 0;
    out_ = std::make_unique<SafetensorsWriter>(dir_ + "/" + files_[shard_], shards_[shard_], metadata_);
  }
  out_->write(name, t);   // an Error when it is not the entry the header promised
  ++written_;
}

void ShardedSafetensorsWriter::finish() {
  if (shard_ + 1 != shards_.size())
    throw Error("safetensors " + dir_ + "/" + files_[shard_ + 1] + " and after: never written (internal)");
  out_->finish();
  if (shards_.size() == 1) return;
  nlohmann::ordered_json map = nlohmann::ordered_json::object();
  for (size_t k = 0; k < shards_.size(); ++k)
    for (const auto& e : shards_[k]) map[e.name] = files_[k];
  nlohmann::ordered_json meta = nlohmann::ordered_json::object();
  for (const auto& [key, value] : metadata_) meta[key] = value;
  meta["total_size"] = total_bytes_;
  const std::string path = dir_ + "/" + stem_ + ".safetensors.index.json";
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << nlohmann::ordered_json{{"metadata", meta}, {"weight_map", map}}.dump(2) << "\n";
  f.flush();
  if (!f) throw Error("cannot write " + path + ": " + std::strerror(errno) + " (disk full?)");
}

void save_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsWriter::Entry> entries;
  for (const auto& [name, t] : tensors) entries.push_back({name, t.scalar_type(), t.sizes().vec()});
  SafetensorsWriter w(path, std::move(entries), metadata);
  for (const auto& [name, t] : tensors) w.write(name, t);
  w.finish();
}

SafetensorsHeader read_safetensors_header(const std::string& path) {
  auto fail = [&](const std::string& why) -> Error { return Error("checkpoint " + path + ": " + why); };
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) throw fail("no such file");
  const uint64_t file_size = std::filesystem::file_size(path, ec);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw fail("cannot be opened");
  if (file_size < 8) throw fail("is " + std::to_string(file_size) + " bytes, too short for a safetensors header");
  unsigned char len[8];
  in.read(reinterpret_cast<char*>(len), 8);
  uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i) header_len |= static_cast<uint64_t>(len[i]) << (8 * i);
  if (header_len > file_size - 8)
    throw fail("header claims " + exact_bytes(header_len) + " but the file has " + exact_bytes(file_size - 8) +
               " after its 8-byte length (truncated?)");
  std::string json(header_len, '\0');
  in.read(json.data(), static_cast<std::streamsize>(header_len));
  const nlohmann::json header = parse_json(json, "checkpoint " + path + ": header", 8);   // bytes count from the file's start
  if (!header.is_object()) throw fail("header is not a JSON object");

  const uint64_t data_start = 8 + header_len, data_size = file_size - data_start;
  SafetensorsHeader result;
  result.path = path;
  struct Entry { std::string name; at::ScalarType type; std::vector<int64_t> shape; uint64_t begin, end; };
  std::vector<Entry> entries;
  try {
    for (const auto& [name, info] : header.items()) {
      if (name == "__metadata__") {
        if (!info.is_object()) throw fail("__metadata__ is not a JSON object of strings");
        for (const auto& [k, v] : info.items()) {
          if (!v.is_string()) throw fail("__metadata__[\"" + k + "\"] is " + v.dump() + ", not a string");
          result.metadata[k] = v.get<std::string>();
        }
        continue;
      }
      Entry e{name, at::kFloat, {}, 0, 0};
      for (const char* key : {"dtype", "shape", "data_offsets"})
        if (!info.is_object() || !info.contains(key)) throw fail("tensor \"" + name + "\" has no \"" + key + "\"");
      if (!info["dtype"].is_string()) throw fail("tensor \"" + name + "\" has dtype " + info["dtype"].dump() + ", not a name");
      std::string dt = info["dtype"].get<std::string>();
      bool known = false;
      for (const auto& d : kDtypes)
        if (dt == d.name) e.type = d.type, known = true;
      if (!known) throw fail("tensor \"" + name + "\" has unsupported dtype " + dt + " (valid: F32, F64, F16, BF16, I64, I32, I16, I8, U8, BOOL)");
      const std::string what = "tensor \"" + name + "\"";
      // Sizes are whole, non-negative and their byte count fits 64 bits, checked here: LibTorch would
      // otherwise truncate 1024.5, or fail on an overflowing product with no file named.
      const nlohmann::json& shape = info["shape"];
      if (!shape.is_array()) throw fail(what + " has shape " + shape.dump() + ", not a list of sizes");
      uint64_t bytes = c10::elementSize(e.type);
      for (const auto& d : shape) {
        const auto whole = whole_number(d);
        if (!whole) throw fail(what + " has shape entry " + d.dump() + " (sizes are whole numbers >= 0)");
        const uint64_t size = *whole;
        if (size > static_cast<uint64_t>(INT64_MAX) || (size != 0 && bytes > UINT64_MAX / size))
          throw fail(what + " has shape " + shape.dump() + ", whose byte size does not fit 64 bits");
        bytes *= size;
        e.shape.push_back(static_cast<int64_t>(size));
      }
      const nlohmann::json& offsets = info["data_offsets"];
      const auto begin = offsets.is_array() && offsets.size() == 2 ? whole_number(offsets[0]) : std::nullopt;
      const auto end = offsets.is_array() && offsets.size() == 2 ? whole_number(offsets[1]) : std::nullopt;
      if (!begin || !end)
        throw fail(what + " has data_offsets " + offsets.dump() + " (expected [begin, end], whole numbers >= 0)");
      const uint64_t off[2] = {*begin, *end};
      if (off[0] > off[1] || off[1] > data_size)
        throw fail(what + " lies outside the file (offsets " + offsets.dump() + " past its " + exact_bytes(data_size) +
                   " of data; truncated?)");
      if (bytes != off[1] - off[0])
        throw fail(what + " has " + std::to_string(off[1] - off[0]) + " bytes but its shape needs " + std::to_string(bytes));
      e.begin = off[0];
      e.end = off[1];
      entries.push_back(std::move(e));
    }
  } catch (const nlohmann::json::exception&) {   // every field is checked above; this is a backstop
    throw fail("malformed header");
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < entries.size(); ++i)
    if (entries[i].begin < entries[i - 1].end)
      throw fail("tensors \"" + entries[i - 1].name + "\" and \"" + entries[i].name + "\" overlap");
  for (auto& e : entries)
    result.entries.push_back({e.name, e.type, std::move(e.shape), data_start + e.begin, e.end - e.begin});
  return result;
}

at::Tensor read_safetensors_tensor(const SafetensorsHeader& header, const SafetensorsEntry& e) {
  std::ifstream in(header.path, std::ios::binary);
  at::Tensor t = at::empty(e.shape, at::TensorOptions().dtype(e.dtype));
  in.seekg(static_cast<std::streamoff>(e.offset));
  in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(e.bytes));
  if (!in) throw Error("checkpoint " + header.path + ": could not read tensor \"" + e.name + "\" (file truncated or changed?)");
  return t;
}

at::Tensor map_file_bytes(const std::string& path, uint64_t offset, uint64_t bytes, const std::string& what) {
  if (bytes == 0) return at::empty({0}, at::kByte);
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(what + ": cannot open " + path + ": " + std::strerror(errno));
  const auto page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t start = offset / page * page, length = offset + bytes - start;
  void* base = mmap(nullptr, length, PROT_READ, MAP_PRIVATE, fd, static_cast<off_t>(start));
  const int e = errno;
  close(fd);   // the mapping keeps the file
  if (base == MAP_FAILED) throw Error(what + ": cannot map " + std::to_string(bytes) + " bytes of " + path + ": " + std::strerror(e));
  void* data = static_cast<char*>(base) + (offset - start);
  return at::from_blob(data, {static_cast<int64_t>(bytes)}, [base, length](void*) { munmap(base, length); }, at::kByte);
}

at::Tensor map_safetensors_tensor(const SafetensorsHeader& header, const SafetensorsEntry& e) {
  if (e.bytes == 0) return at::empty(e.shape, at::TensorOptions().dtype(e.dtype));
  return map_file_bytes(header.path, e.offset, e.bytes, "checkpoint " + header.path + " (tensor \"" + e.name + "\")").view(e.dtype).view(e.shape);
}

SafetensorsFile load_safetensors(const std::string& path) {
  const SafetensorsHeader header = read_safetensors_header(path);
  SafetensorsFile result;
  result.metadata = header.metadata;
  for (const auto& e : header.entries) result.tensors.push_back({e.name, read_safetensors_tensor(header, e)});
  return result;
}


bool SafetensorsFile::contains(const std::string& name) const {
  for (const auto& t : tensors)
    if (t.name == name) return true;
  return false;
}

const at::Tensor& SafetensorsFile::at(const std::string& name, const std::string& path) const {
  for (const auto& t : tensors)
    if (t.name == name) return t.tensor;
  throw Error("checkpoint " + path + ": tensor \"" + name + "\" is missing");
}

}  // namespace colossal
