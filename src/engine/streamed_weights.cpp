// Streamed weights for generation: see streamed_weights.h.
#include "src/engine/streamed_weights.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>

#include "src/core/device.h"
#include "src/core/error.h"
#include "src/engine/checkpoint.h"
#include "src/nn/block.h"
#include "src/nn/factory.h"

namespace colossal {
namespace {

constexpr int64_t kParamAlign = 64;   // each parameter's place in a cache region: cache-line aligned

int64_t align_up(int64_t n, int64_t a) { return (n + a - 1) / a * a; }

// Bytes a block's tensors may span in a checkpoint beyond their own before reading them in place reads
// too much else (another block's tensors filed between them): a quarter more, or 1 MiB.
int64_t span_allowance(int64_t own) { return std::max<int64_t>(own / 4, 1 << 20); }

}  // namespace

StreamSource parse_stream_source(const std::string& name) {
  if (name == "auto") return StreamSource::automatic;
  if (name == "checkpoint") return StreamSource::checkpoint;
  if (name == "cache") return StreamSource::cache;
  throw Error("--stream-source '" + name + "' is not auto, checkpoint or cache");
}

StreamIo parse_stream_io(const std::string& name) {
  if (name == "auto") return StreamIo::automatic;
  if (name == "direct") return StreamIo::direct;
  if (name == "page-cache") return StreamIo::page_cache;
  throw Error("--stream-io '" + name + "' is not auto, direct or page-cache");
}

StreamedWeights::StreamedWeights(nn::Model& model, const HfWeights& weights, c10::Device device, const std::string& cache_dir,
                                 StreamSource source, StreamIo io)
    : device_(device) {
  if (model.blocks().empty()) throw Error("streamed weights: the model has no blocks to stream");
  std::map<const void*, int64_t> block_of;
  for (size_t b = 0; b < model.blocks().size(); ++b)
    for (const auto& p : model.blocks()[b]->parameters()) block_of[p.unsafeGetTensorImpl()] = static_cast<int64_t>(b);
  blocks_.resize(model.blocks().size());
  std::map<std::string, at::Tensor> outside;
  std::map<std::string, std::pair<int64_t, size_t>> place;   // a block parameter's block and index
  for (const auto& item : model.named_parameters()) {
    auto it = block_of.find(item.value().unsafeGetTensorImpl());
    if (it == block_of.end()) {
      outside.emplace(item.key(), item.value());
      continue;
    }
    auto& params = blocks_[static_cast<size_t>(it->second)];
    place[item.key()] = {it->second, params.size()};
    params.push_back({item.key(), item.value(), 0, item.value().sizes().vec(), false});
  }

  std::vector<std::string> paths;
  std::string why_not = source == StreamSource::cache ? "the cache was asked for" : plan_in_place(model, weights, paths);
  if (!why_not.empty() && source == StreamSource::checkpoint)
    throw Error("--stream-source checkpoint: " + weights.describe() + " cannot be read in place: " + why_not +
                "; use --stream-source auto or cache");
  in_place_ = why_not.empty();
  if (!in_place_) plan_cache();
  int64_t largest = 0;   // a block's buffer: its pieces, each from an aligned place
  for (const auto& pieces : pieces_) {
    for (const Piece& p : pieces) {
      block_bytes_ += p.bytes;
      largest = std::max(largest, p.at + memory::io_round_up(p.bytes));
    }
  }
  memory::OffloadFileOptions options;
  // Through the page cache while the blocks fit in half of what this process may hold (a job's or a
  // container's memory limit counts the cache too), else around it.
  options.direct = io == StreamIo::automatic ? static_cast<double>(block_bytes_) > 0.5 * static_cast<double>(usable_memory_bytes())
                                             : io == StreamIo::direct;
  mapped_ = in_place_ && !options.direct;
  if (mapped_) {
    for (const auto& pieces : pieces_) {
      mapped_pieces_.emplace_back();
      for (const Piece& p : pieces)
        mapped_pieces_.back().push_back(map_file_bytes(paths[p.file], static_cast<uint64_t>(p.offset), static_cast<uint64_t>(p.bytes),
                                                       "checkpoint file " + paths[p.file]));
    }
  } else if (in_place_) {
    for (const auto& path : paths) files_.push_back(memory::OffloadFile::open_for_reading(path, "checkpoint file " + path, options));
  } else {
    const Piece& last = pieces_.back().front();
    const int64_t total = last.offset + memory::io_round_up(last.bytes);
    files_.push_back(std::make_unique<memory::OffloadFile>(cache_dir, total, "streamed weights cache in " + cache_dir, options));
  }
  if (!mapped_)
    for (auto& b : buffers_) b = memory::AlignedBuffer(largest);

  // One pass over the checkpoint, in the model's order: the parameters outside the blocks stay. For the
  // cache, each block's are held until the block is complete, then copied into buffer 0 and written.
  at::NoGradGuard no_grad;
  std::vector<size_t> missing(blocks_.size());
  for (size_t b = 0; b < blocks_.size(); ++b) missing[b] = blocks_[b].size();
  std::vector<std::vector<at::Tensor>> held(blocks_.size());   // values of blocks not yet complete
  auto write_block = [&](int64_t b) {
    const auto& params = blocks_[static_cast<size_t>(b)];
    for (size_t i = 0; i < params.size(); ++i) {
      const at::Tensor& v = held[static_cast<size_t>(b)][i];
      std::memcpy(buffers_[0].data() + params[i].offset, v.const_data_ptr(), v.nbytes());
    }
    held[static_cast<size_t>(b)].clear();
    const Piece& p = pieces_[static_cast<size_t>(b)].front();
    files_.front()->wait(files_.front()->write(p.offset, buffers_[0].data(), p.bytes));
  };
  read_model_state(
      model, weights,
      [&](const std::string& name, const at::Tensor& value) {
        if (auto it = outside.find(name); it != outside.end()) {
          it->second.set_data(value.to(device_));
          resident_bytes_ += static_cast<int64_t>(value.nbytes());
          return;
        }
        const auto [b, i] = place.at(name);
        auto& vals = held[static_cast<size_t>(b)];
        if (vals.empty()) vals.resize(blocks_[static_cast<size_t>(b)].size());
        vals[i] = value.contiguous();
        if (--missing[static_cast<size_t>(b)] == 0) write_block(b);
      },
      [&](const std::string& name) { return !in_place_ || outside.count(name) > 0; });
  read(0, 0);   // the first block, for the first token
}

std::string StreamedWeights::plan_in_place(const nn::Model& model, const HfWeights& weights, std::vector<std::string>& paths) {
  const auto as_is = parameters_stored_as_is(model, weights);
  std::map<std::string, size_t> file_index;
  std::vector<std::vector<Piece>> pieces(blocks_.size());
  for (size_t b = 0; b < blocks_.size(); ++b) {
    struct Span {
      uint64_t lo = UINT64_MAX, hi = 0;
      int64_t own = 0;
    };
    std::map<std::string, Span> spans;   // the block's bytes in each file holding some of them
    for (const Param& p : blocks_[b]) {
      auto it = as_is.find(p.name);
      if (it == as_is.end())
        return "\"" + p.name + "\" is not one " + std::string(p.tensor.scalar_type() == at::kFloat ? "fp32" : c10::toString(p.tensor.scalar_type())) +
               " tensor in the file, as computed or transposed (OPT's separate q/k/v, BLOOM's interleaved heads and fp16 or bf16 "
               "files are converted into the cache)";
      Span& span = spans[it->second.file];
      span.lo = std::min(span.lo, it->second.offset);
      span.hi = std::max(span.hi, it->second.offset + it->second.bytes);
      span.own += static_cast<int64_t>(it->second.bytes);
    }
    int64_t at = 0;
    for (const auto& [file, span] : spans) {
      const auto bytes = static_cast<int64_t>(span.hi - span.lo);
      if (bytes > span.own + span_allowance(span.own))
        return "block " + std::to_string(b) + "'s tensors are scattered across " + file + " (" + std::to_string(bytes) + " bytes around their " +
               std::to_string(span.own) + ")";
      if (!file_index.count(file)) {
        file_index.emplace(file, paths.size());
        paths.push_back(file);
      }
      Piece piece{file_index.at(file), static_cast<int64_t>(span.lo) / memory::kIoAlign * memory::kIoAlign, 0, at};
      piece.bytes = static_cast<int64_t>(span.hi) - piece.offset;
      at += memory::io_round_up(piece.bytes);
      pieces[b].push_back(piece);
    }
  }
  // Every block can be read in place: each parameter's place is its bytes' place in its file's piece.
  for (size_t b = 0; b < blocks_.size(); ++b)
    for (Param& p : blocks_[b]) {
      const StoredAsIs& s = as_is.at(p.name);
      const Piece& piece = *std::find_if(pieces[b].begin(), pieces[b].end(), [&](const Piece& q) { return paths[q.file] == s.file; });
      p.offset = piece.at + static_cast<int64_t>(s.offset) - piece.offset;
      p.piece = static_cast<size_t>(&piece - pieces[b].data());
      p.shape = s.stored_shape;
      p.transpose = s.transpose;
    }
  pieces_ = std::move(pieces);
  return "";
}

void StreamedWeights::plan_cache() {
  // Each block's region: its parameters one after another, in our layout and their own types (fp32; a
  // quantized layer's integers and scales).
  int64_t total = 0;
  for (auto& params : blocks_) {
    int64_t at = 0;
    for (auto& p : params) {
      p.offset = at;
      at = align_up(at + static_cast<int64_t>(p.tensor.nbytes()), kParamAlign);
    }
    pieces_.push_back({{0, total, at, 0}});
    total += memory::io_round_up(at);
  }
}

StreamedWeights::~StreamedWeights() {
  try {
    stop();
  } catch (const Error&) {   // a read nobody will use failed: the run is ending anyway
  }
}

int64_t StreamedWeights::bytes_read() const {
  int64_t n = mapped_bytes_;
  for (const auto& f : files_) n += f->bytes_read();
  return n;
}

void StreamedWeights::stop() {
  std::optional<Error> failed;   // every read is waited for before the buffer can be reused; then the first failure
  for (const auto& [file, ticket] : pending_) {
    try {
      files_[file]->wait(ticket);
    } catch (const Error& e) {
      if (!failed) failed = e;
    }
  }
  pending_.clear();
  pending_block_ = -1;
  if (failed) throw *failed;
}

void StreamedWeights::read(int64_t block, int buffer) {
  pending_block_ = block;
  pending_buffer_ = buffer;
  const auto& pieces = pieces_[static_cast<size_t>(block)];
  for (size_t i = 0; i < pieces.size(); ++i) {
    const Piece& p = pieces[i];
    if (mapped_) {   // the kernel reads the pages ahead while this block runs; nothing to wait for
      // (pieces start at kIoAlign offsets, which mmap's page rounding keeps: each mapping starts at its data)
      const at::Tensor& m = mapped_pieces_[static_cast<size_t>(block)][i];
      ::madvise(m.data_ptr(), static_cast<size_t>(m.numel()), MADV_WILLNEED);
      mapped_bytes_ += p.bytes;
    } else {
      pending_.emplace_back(p.file, files_[p.file]->read(p.offset, buffers_[buffer].data() + p.at, p.bytes));
    }
  }
  ++blocks_read_;
}

void StreamedWeights::before_forward(int64_t block) {
  if (pending_block_ != block) {   // not the one read ahead (blocks ran out of order): read it now, into the same buffer
    stop();
    read(block, pending_buffer_);
  }
  const int buffer = pending_buffer_;
  stop();   // waits for the read: the block's weights are in buffers_[buffer]
  at::NoGradGuard no_grad;
  for (auto& p : blocks_[static_cast<size_t>(block)]) {
    at::Tensor view;
    if (mapped_) {   // read-only memory: the blocks' weights are only ever read
      const Piece& piece = pieces_[static_cast<size_t>(block)][p.piece];
      const at::Tensor& m = mapped_pieces_[static_cast<size_t>(block)][p.piece];   // kept alive by the streamer
      view = m.narrow(0, p.offset - piece.at, static_cast<int64_t>(p.tensor.nbytes())).view(p.tensor.scalar_type()).view(p.shape);
    } else {
      view = buffers_[buffer].view(p.offset, p.tensor.numel(), p.tensor.scalar_type()).view(p.shape);
    }
    if (p.transpose) view = view.t();
    p.tensor.set_data(device_.is_cpu() ? view : view.to(device_));
  }
  // Measured, not counted: the blocks whose weights are in place now, plus the one about to be read.
  int64_t held = 0;
  for (const auto& ps : blocks_) held += !ps.empty() && !nn::is_unallocated(ps.front().tensor);
  most_held_ = std::max(most_held_, held + 1);
  read((block + 1) % static_cast<int64_t>(blocks_.size()), 1 - buffer);   // into the other buffer, while this block runs
}

void StreamedWeights::after_forward(int64_t block) {
  at::NoGradGuard no_grad;
  for (auto& p : blocks_[static_cast<size_t>(block)]) p.tensor.set_data(nn::unallocated_tensor(p.tensor.sizes(), p.tensor.scalar_type()));
}

std::shared_ptr<StreamedWeights> stream_blocks(nn::Model& model, const HfWeights& weights, c10::Device device,
                                               const std::string& cache_dir, StreamSource source, StreamIo io) {
  auto streamed = std::make_shared<StreamedWeights>(model, weights, device, cache_dir, source, io);
  auto chain = std::make_shared<nn::BlockHooks>();
  chain->add(streamed);
  model.set_block_hooks(chain);
  return streamed;
}

}  // namespace colossal
