// Chunk store: see chunk_store.h.
#include "src/memory/chunk_store.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <algorithm>

#include "src/core/error.h"
#include "src/memory/device_copies.h"
#include "src/nn/block.h"
#include "src/nn/factory.h"
#include "src/nn/model.h"

namespace colossal::memory {

std::vector<ChunkTensorSpec> chunk_specs(nn::Module& module) {
  std::vector<ChunkTensorSpec> specs;
  for (auto& item : module.named_parameters()) {
    if (!item.value().requires_grad()) continue;
    specs.push_back({item.key(), item.value().sizes().vec(), item.value().dim() >= 2});
  }
  return specs;
}

std::function<int64_t(const at::Tensor&)> parameter_blocks(nn::Module& module) {
  auto* model = dynamic_cast<nn::Model*>(&module);
  if (!model || model->blocks().empty()) return {};
  auto owner = std::make_shared<std::map<const void*, int64_t>>();
  for (size_t b = 0; b < model->blocks().size(); ++b)
    for (const auto& p : model->blocks()[b]->parameters()) (*owner)[p.unsafeGetTensorImpl()] = static_cast<int64_t>(b);
  return [owner](const at::Tensor& p) {
    auto it = owner->find(p.unsafeGetTensorImpl());
    return it == owner->end() ? int64_t{-1} : it->second;
  };
}

namespace {

// Spare buffers kept per size: a block's chunks, the next block's being prefetched, and the overlap of
// a backward's gathers with the release of the block before.
constexpr size_t kSpareBuffers = 4;

}  // namespace

ChunkStore::ChunkStore(nn::Module& module, int stage, int64_t chunk_numel, int64_t shards, int64_t rank,
                       std::optional<at::ScalarType> compute, const std::function<int64_t(const at::Tensor&)>& block_of,
                       std::optional<c10::Device> device, const std::optional<StoreOffload>& offload, StoreHomes homes,
                       bool compact)
    : stage_(stage), rank_(stage == 0 ? 0 : rank), compact_asked_(compact), spare_limit_(kSpareBuffers) {
  if (stage < 0 || stage > 3) throw Error("chunk store: ZeRO stage " + std::to_string(stage) + " (internal: 0 to 3)");
  if (stage == 3 && !block_of) throw Error("chunk store: ZeRO-3 needs the model's blocks (internal)");
  const auto specs = chunk_specs(module);
  if (specs.empty()) throw Error("chunk store: the model has no trainable parameters");
  layout_ = plan_chunks(specs, chunk_numel, stage == 0 ? 1 : shards);
  for (size_t i = 0; i < layout_.slots.size(); ++i) slot_by_name_[layout_.slots[i].name] = static_cast<int64_t>(i);
  std::map<std::string, at::Tensor> by_name;
  for (auto& item : module.named_parameters()) by_name[item.key()] = item.value();
  const at::ScalarType dtype = by_name.at(specs.front().name).scalar_type();   // read now: set_data changes it
  const auto master_options = at::TensorOptions().dtype(dtype).device(device.value_or(by_name.at(specs.front().name).device()));
  const auto options = master_options.dtype(compute.value_or(dtype));
  mixed_ = options.dtype() != master_options.dtype();
  master_options_ = master_options;
  if (offload) {
    if (offload->state_names.empty()) throw Error("chunk store: nothing to offload without optimizer states (internal)");
    if (offload->params && stage_ != 3) throw Error("chunk store: parameters go to NVMe under ZeRO-3 only (internal)");
    // Before any value is written, so the master weights stream into the file and never sit in memory whole.
    offloaded_names_ = offload->state_names;
    params_on_disk_ = offload->params;
    master_on_disk_ = mixed_ || params_on_disk_;   // with the parameters, the master is what a block's chunk is read from
    std::vector<int64_t> numels;
    for (int64_t c = 0; c < layout_.chunks(); ++c) numels.push_back(shard_numel(c));
    const std::string what = params_on_disk_ ? " (parameters and optimizer states)"
                             : mixed_        ? " (optimizer states and master weights)"
                                             : " (optimizer states)";
    offloaded_ = std::make_unique<OffloadedStates>(numels, static_cast<int>(offloaded_names_.size()) + (master_on_disk_ ? 1 : 0),
                                                   master_options_.dtype().toScalarType(), offload->dir, "nvme_path " + offload->dir + what,
                                                   offload->slice_numel);
  }
  at::NoGradGuard no_grad;
  releasable_.assign(static_cast<size_t>(layout_.chunks()), false);
  param_shards_.resize(static_cast<size_t>(layout_.chunks()));
  param_home_.assign(static_cast<size_t>(layout_.chunks()), homes.params);
  state_home_.assign(static_cast<size_t>(layout_.chunks()), homes.states);
  master_own_.assign(static_cast<size_t>(layout_.chunks()), false);
  master_.resize(static_cast<size_t>(layout_.chunks()));
  master_grads_.resize(static_cast<size_t>(layout_.chunks()));
  // Each residence's memory: the compute device's, or the host's (on a CPU the same).
  const auto param_options = options.device(device_of(homes.params));
  const auto state_device = device_of(homes.states);
  // Chunk by chunk. A parameter that already has values (an allocated model) gives them to the chunk
  // and its own memory goes; a deferred one takes its values later through write(). Under ZeRO-3 a
  // releasable chunk's whole buffer is never written: views are cut from it, then it is released and
  // only this rank's shard is filled, so the peak is one untouched chunk, never the model.
  for (int64_t c = 0; c < layout_.chunks(); ++c) {
    const auto k = static_cast<size_t>(c);
    const int64_t size = layout_.chunk_sizes[k];
    bool all_in_blocks = true;
    for (int64_t i : layout_.chunk_slots[k]) {
      slot_block_.push_back(block_of ? block_of(by_name.at(layout_.slots[static_cast<size_t>(i)].name)) : -1);
      all_in_blocks &= slot_block_.back() >= 0;
    }
    // ZeRO-3: a chunk whose tensors all belong to blocks keeps only its shard between uses (the blocks'
    // hooks gather it); the embeddings, final norm and head stay whole.
    releasable_[k] = stage_ == 3 && all_in_blocks;
    params_.push_back(releasable_[k] ? at::empty({size}, options) : at::zeros({size}, options));   // padding stays zero
    if (releasable_[k] && !params_on_disk(c))
      param_shards_[k] = homes.params == Residence::host ? host_param_shard(c, at::Tensor()) : at::zeros({shard_numel(c)}, param_options);
    if (stage_ <= 1) full_grads_.push_back(at::zeros({size}, options));
    if (stage_ == 0) grad_shards_.push_back(full_grads_.back());
    if (stage_ == 1) grad_shards_.push_back(full_grads_.back().narrow(0, shard_begin(c), shard_numel(c)));
    if (stage_ >= 2) grad_shards_.push_back(at::zeros({shard_numel(c)}, (compact_grads() ? options : master_options).device(state_device)));
    bind_master(c);
    std::vector<std::pair<int64_t, at::Tensor>> values;   // the allocated parameters' own values
    for (int64_t i : layout_.chunk_slots[k]) {
      const auto& slot = layout_.slots[static_cast<size_t>(i)];
      at::Tensor p = by_name.at(slot.name);
      const bool deferred = nn::is_unallocated(p);
      if (p.scalar_type() != dtype || (!deferred && p.device() != master_options.device()))
        throw Error("chunk store: parameter \"" + slot.name + "\" is " + c10::toString(p.scalar_type()) + " on " + p.device().str() +
                    ", the chunks are " + c10::toString(dtype) + " on " + master_options.device().str() +
                    " (one dtype and device per model)");
      if (!deferred) values.emplace_back(i, p.detach());   // keeps the old storage past set_data
      p.set_data(params_[k].narrow(0, slot.offset, slot.numel).view(p.sizes()));
      if (stage_ <= 1) p.mutable_grad() = full_grads_[k].narrow(0, slot.offset, slot.numel).view(p.sizes());
      tensors_.push_back(p);
      states_.push_back(TensorState::hold);
    }
    if (releasable_[k]) release(c);
    for (const auto& [i, value] : values) write(i, value);
  }
}

void ChunkStore::write(int64_t slot, const at::Tensor& value) {
  const auto& s = layout_.slots[static_cast<size_t>(slot)];
  if (value.sizes() != c10::IntArrayRef(s.shape))
    throw Error("chunk store: \"" + s.name + "\" written with shape " + c10::str(value.sizes()) + ", expected " +
                c10::str(c10::IntArrayRef(s.shape)) + " (internal)");
  at::NoGradGuard no_grad;
  const auto k = static_cast<size_t>(s.chunk);
  const at::Tensor flat = value.detach().reshape({-1});
  if (present(s.chunk)) params_[k].narrow(0, s.offset, s.numel).copy_(flat);
  const auto part = shard_part(slot);
  if (!part) return;
  const at::Tensor mine = flat.narrow(0, part->in_tensor, part->numel);
  if (param_shards_[k].defined()) param_shards_[k].narrow(0, part->in_shard, part->numel).copy_(mine);
  if (master_own_[k] || master_on_disk_) write_master(s.chunk, part->in_shard, mine);   // at full precision
}

void ChunkStore::bind_master(int64_t chunk) {
  const auto k = static_cast<size_t>(chunk);
  const c10::Device sdev = device_of(state_home_[k]);
  if (master_on_disk_) {
    master_[k] = at::Tensor();
  } else {
    const bool own = mixed_ || param_shard(chunk).device() != sdev;
    if (!own) master_[k] = param_shard(chunk);
    else if (!master_own_[k]) master_[k] = param_shard(chunk).to(master_options_.device(sdev), /*non_blocking=*/false, /*copy=*/true);
    else master_[k] = master_[k].to(sdev);
    master_own_[k] = own;
  }
  const at::Tensor& g = grad_shards_[k];
  if (g.scalar_type() == master_options_.dtype().toScalarType() && g.device() == sdev) master_grads_[k] = g;
  else if (compact_grads()) master_grads_[k] = at::Tensor();   // converted slice by slice as the update reads them
  else if (!master_grads_[k].defined() || master_grads_[k].is_same(g) || master_grads_[k].device() != sdev)
    master_grads_[k] = at::zeros({shard_numel(chunk)}, master_options_.device(sdev));   // collect_grads fills it each step
}

void ChunkStore::set_homes(int64_t chunk, StoreHomes homes) {
  at::NoGradGuard no_grad;
  const auto k = static_cast<size_t>(chunk);
  param_home_[k] = homes.params;
  state_home_[k] = homes.states;
  auto move = [](at::Tensor& t, c10::Device d) {   // to() is the tensor itself where it already is
    if (t.defined()) t = t.to(d);
  };
  if (homes.params == Residence::host && param_shards_[k].defined() && !param_shards_[k].is_cpu())
    param_shards_[k] = host_param_shard(chunk, param_shards_[k]);
  else
    move(param_shards_[k], device_of(homes.params));
  if (stage_ >= 2) move(grad_shards_[k], device_of(homes.states));
  for (auto& [name, shards] : optimizer_states_) move(shards[k], device_of(homes.states));
  bind_master(chunk);
}

at::Tensor ChunkStore::host_param_shard(int64_t chunk, const at::Tensor& value) const {
  const at::ScalarType dtype = params_[static_cast<size_t>(chunk)].scalar_type();
  // A GPU copies each gather's shard from page-locked memory beside compute (ZeroStrategy's side
  // stream); a CPU has nothing to copy.
  at::Tensor shard = device().is_cuda() ? page_locked_empty(shard_numel(chunk), dtype)
                                        : at::empty({shard_numel(chunk)}, at::TensorOptions().dtype(dtype));
  if (value.defined())
    shard.copy_(value);
  else
    shard.zero_();
  return shard;
}

int64_t ChunkStore::host_param_bytes(int64_t chunk) const {
  const auto k = static_cast<size_t>(chunk);
  return param_home_[k] == Residence::host && param_shards_[k].defined() ? static_cast<int64_t>(param_shards_[k].nbytes()) : 0;
}

int64_t ChunkStore::spare_bytes() const {
  int64_t n = 0;
  for (const auto& [size, spare] : spare_) n += static_cast<int64_t>(size * spare.size());
  return n;
}

size_t ChunkStore::spares_of(size_t nbytes) const {
  auto it = spare_.find(nbytes);
  return it == spare_.end() ? 0 : it->second.size();
}

void ChunkStore::trim_spares(const std::map<size_t, size_t>& keep) {
  for (auto& [size, spare] : spare_) {
    auto it = keep.find(size);
    const size_t n = it == keep.end() ? 0 : it->second;
    if (spare.size() > n) spare.resize(n);
  }
}

void ChunkStore::set_spare_limit(size_t n) {
  spare_limit_ = n;
  for (auto& [size, spare] : spare_)
    if (spare.size() > n) spare.resize(n);
}

std::optional<int64_t> ChunkStore::slot_of(const std::string& name) const {
  auto it = slot_by_name_.find(name);
  return it == slot_by_name_.end() ? std::nullopt : std::optional<int64_t>(it->second);
}

void ChunkStore::set_state(int64_t slot, TensorState to) {
  transition(states_[static_cast<size_t>(slot)], to, layout_.slots[static_cast<size_t>(slot)].name);
}

std::optional<ChunkStore::ShardPart> ChunkStore::shard_part(int64_t slot) const {
  const auto& s = layout_.slots[static_cast<size_t>(slot)];
  const int64_t lo = shard_begin(s.chunk), hi = lo + shard_numel(s.chunk);
  const int64_t a = std::max(lo, s.offset), b = std::min(hi, s.offset + s.numel);
  if (a >= b) return std::nullopt;
  return ShardPart{a - s.offset, a - lo, b - a};
}

// A ZeRO-3 chunk is released and gathered again without replacing its storage object, only the memory
// behind it, so every view of it (the model's parameters, and the views autograd saved for backward)
// sees the gathered values. The memory goes to a few spare buffers rather than back to malloc: every
// block's chunks are gathered and released twice a step, and returning them each time fragmented
// glibc's heap, whose resident size then grew by several chunks a step.
void ChunkStore::release(int64_t chunk, bool keep_spare) {
  for (int64_t i : layout_.chunk_slots[static_cast<size_t>(chunk)]) set_state(i, TensorState::free);
  c10::StorageImpl* s = params_[static_cast<size_t>(chunk)].storage().unsafeGetStorageImpl();
  const size_t nbytes = s->nbytes();
  if (nbytes == 0) return;
  at::DataPtr memory = s->set_data_ptr(at::DataPtr(nullptr, s->device()));
  s->set_nbytes(0);
  auto& spare = spare_[nbytes];
  if (keep_spare && spare.size() < spare_limit_) spare.push_back(std::move(memory));   // else freed here
}

const at::Tensor& ChunkStore::materialize(int64_t chunk) {
  const at::Tensor& whole = params_[static_cast<size_t>(chunk)];
  c10::StorageImpl* s = whole.storage().unsafeGetStorageImpl();
  const size_t nbytes = whole.nbytes();
  if (s->nbytes() == nbytes) return whole;
  auto& spare = spare_[nbytes];
  if (spare.empty()) {
    s->set_data_ptr_noswap(s->allocator()->allocate(nbytes));
  } else {
    s->set_data_ptr_noswap(std::move(spare.back()));
    spare.pop_back();
  }
  s->set_nbytes(nbytes);
  return whole;
}

void ChunkStore::gathered(int64_t chunk) {
  for (int64_t i : layout_.chunk_slots[static_cast<size_t>(chunk)]) set_state(i, TensorState::hold);
}

bool ChunkStore::present(int64_t chunk) const { return params_[static_cast<size_t>(chunk)].storage().nbytes() > 0; }

at::Tensor ChunkStore::param_shard(int64_t chunk) const {
  const auto k = static_cast<size_t>(chunk);
  if (params_on_disk(chunk)) {
    at::Tensor master = at::empty({shard_numel(chunk)}, master_options_);
    offloaded_->read(chunk, master_segment(), 0, master);
    return master.to(params_[k].scalar_type());
  }
  return releasable_[k] ? param_shards_[k] : params_[k].narrow(0, shard_begin(chunk), shard_numel(chunk));
}

void ChunkStore::collect_grads(double inv_scale) {
  at::NoGradGuard no_grad;
  if (compact_grads()) {   // converted slice by slice as the update reads them
    grad_factor_ = inv_scale;
    return;
  }
  for (size_t c = 0; c < master_grads_.size(); ++c) {
    at::Tensor& out = master_grads_[c];
    if (!out.is_same(grad_shards_[c])) out.copy_(grad_shards_[c]);
    if (inv_scale != 1.0) out.mul_(inv_scale);
  }
}

void ChunkStore::publish() {
  for (int64_t c = 0; c < layout_.chunks(); ++c) publish_chunk(c);
}

void ChunkStore::publish_chunk(int64_t chunk) {
  if (master_on_disk_ || !master_own_[static_cast<size_t>(chunk)]) return;
  publish_range(chunk, 0, master_[static_cast<size_t>(chunk)]);
}

void ChunkStore::publish_range(int64_t chunk, int64_t begin, const at::Tensor& master) {
  // A master that is the parameter shard itself has nothing to publish. A block chunk whose parameters
  // are on disk is read from the master when next used.
  if ((!master_own_[static_cast<size_t>(chunk)] && !master_on_disk_) || params_on_disk(chunk)) return;
  at::NoGradGuard no_grad;
  param_shard(chunk).narrow(0, begin, master.numel()).copy_(master);
}

at::Tensor ChunkStore::master_chunk(int64_t chunk) {
  if (!master_on_disk_) return master_[static_cast<size_t>(chunk)];
  at::Tensor copy = at::empty({shard_numel(chunk)}, master_options_);
  offloaded_->read(chunk, master_segment(), 0, copy);
  return copy;
}

void ChunkStore::write_master(int64_t chunk, int64_t begin, const at::Tensor& values) {
  at::NoGradGuard no_grad;
  if (master_on_disk_) offloaded_->write(chunk, master_segment(), begin, values);
  else master_[static_cast<size_t>(chunk)].narrow(0, begin, values.numel()).copy_(values);
}

int64_t ChunkStore::shard_begin(int64_t chunk) const { return stage_ == 0 ? 0 : rank_ * layout_.shard_numel(chunk); }
int64_t ChunkStore::shard_numel(int64_t chunk) const { return layout_.shard_numel(chunk); }

int64_t ChunkStore::owner(int64_t slot) const {
  if (stage_ == 0) return 0;
  const auto& s = layout_.slots[static_cast<size_t>(slot)];
  return s.offset / layout_.shard_numel(s.chunk);
}

std::vector<at::Tensor>& ChunkStore::state(const std::string& name) {
  if (offloaded_) throw Error("chunk store: optimizer state \"" + name + "\" is offloaded; read it chunk by chunk (internal)");
  auto [it, added] = optimizer_states_.try_emplace(name);
  if (added)
    for (int64_t c = 0; c < layout_.chunks(); ++c)
      it->second.push_back(at::zeros({shard_numel(c)}, master_options_.device(device_of(state_home_[static_cast<size_t>(c)]))));
  return it->second;
}

void ChunkStore::scale_grads(double factor) {
  at::NoGradGuard no_grad;
  if (compact_grads()) {
    grad_factor_ *= factor;
    return;
  }
  for (auto& g : master_grads_) g.mul_(factor);
}

at::Tensor ChunkStore::master_grad(int64_t chunk, int64_t begin, int64_t numel) const {
  const auto c = static_cast<size_t>(chunk);
  if (!compact_grads()) return master_grads_[c].narrow(0, begin, numel);
  at::Tensor g = grad_shards_[c].narrow(0, begin, numel).to(master_options_.dtype());
  if (grad_factor_ != 1.0) g.mul_(grad_factor_);
  return g;
}

std::vector<optim::ParamPiece> ChunkStore::range_pieces(int64_t chunk, int64_t begin, int64_t numel, const at::Tensor& master,
                                                        const std::vector<at::Tensor>& states, double weight_decay, bool half_grads) {
  const auto c = static_cast<size_t>(chunk);
  std::vector<optim::ParamPiece> out;
  const bool as_stored = half_grads && compact_grads();
  const at::Tensor grad = as_stored ? grad_shards_[c].narrow(0, begin, numel) : master_grad(chunk, begin, numel);
  for (int64_t i : layout_.chunk_slots[c]) {
    const auto part = shard_part(i);
    if (!part) continue;
    const int64_t lo = std::max(begin, part->in_shard), hi = std::min(begin + numel, part->in_shard + part->numel);
    if (lo >= hi) continue;
    optim::ParamPiece piece;
    piece.param = master.narrow(0, lo - begin, hi - lo);
    piece.grad = grad.narrow(0, lo - begin, hi - lo);
    if (as_stored) piece.grad_factor = grad_factor_;
    for (const auto& st : states) piece.state.push_back(st.narrow(0, lo - begin, hi - lo));
    piece.weight_decay = layout_.slots[static_cast<size_t>(i)].decay ? weight_decay : 0.0;
    piece.tensor = i;
    out.push_back(std::move(piece));
  }
  return out;
}

std::vector<optim::ParamPiece> ChunkStore::pieces(const std::vector<std::string>& state_names, double weight_decay, bool half_grads) {
  std::vector<optim::ParamPiece> out;
  for (int64_t c = 0; c < layout_.chunks(); ++c)
    for (auto& piece : range_pieces(c, 0, shard_numel(c), master_chunk(c), chunk_states(c, state_names), weight_decay, half_grads))
      out.push_back(std::move(piece));
  return out;
}

std::vector<at::Tensor> ChunkStore::chunk_states(int64_t chunk, const std::vector<std::string>& state_names) {
  std::vector<at::Tensor> out;
  if (!offloaded_) {
    for (const auto& n : state_names) out.push_back(state(n)[static_cast<size_t>(chunk)]);
    return out;
  }
  if (state_names != offloaded_names_) throw Error("chunk store: asked for optimizer states other than the offloaded ones (internal)");
  for (size_t k = 0; k < state_names.size(); ++k) {
    out.push_back(at::empty({shard_numel(chunk)}, master_options_));
    offloaded_->read(chunk, static_cast<int>(k), 0, out.back());
  }
  return out;
}

void ChunkStore::write_state(int64_t chunk, const std::string& name, int64_t begin, const at::Tensor& values) {
  at::NoGradGuard no_grad;
  if (!offloaded_) {
    state(name)[static_cast<size_t>(chunk)].narrow(0, begin, values.numel()).copy_(values);
    return;
  }
  const auto k = std::find(offloaded_names_.begin(), offloaded_names_.end(), name) - offloaded_names_.begin();
  if (k == static_cast<std::ptrdiff_t>(offloaded_names_.size())) throw Error("chunk store: no offloaded state \"" + name + "\" (internal)");
  offloaded_->write(chunk, static_cast<int>(k), begin, values);
}

ChunkBytes ChunkStore::chunk_bytes(int64_t chunk) const {
  const auto c = static_cast<size_t>(chunk);
  auto n = [](const at::Tensor& t) { return t.defined() ? static_cast<int64_t>(t.nbytes()) : int64_t{0}; };   // undefined: not held
  ChunkBytes b;
  const bool params_host = param_home_[c] == Residence::host, states_host = state_home_[c] == Residence::host;
  b.params = static_cast<int64_t>(params_[c].storage().nbytes());   // the whole chunk, on the device: 0 when released
  const int64_t shard = n(param_shards_[c]), master = master_own_[c] ? n(master_[c]) : 0;
  b.params += shard + master;
  b.host += (params_host ? shard : 0) + (states_host ? master : 0);
  if (stage_ <= 1) b.grads += n(full_grads_[c]);   // on the device
  const int64_t grads = (stage_ >= 2 ? n(grad_shards_[c]) : 0) +
                        (master_grads_[c].defined() && !master_grads_[c].is_same(grad_shards_[c]) ? n(master_grads_[c]) : 0);
  b.grads += grads;
  for (const auto& [name, shards] : optimizer_states_) b.optimizer += n(shards[c]);
  if (states_host) b.host += grads + b.optimizer;
  if (offloaded_) b.nvme = offloaded_->chunk_file_bytes(chunk);
  return b;
}

ChunkBytes ChunkStore::bytes() const {
  ChunkBytes b;
  for (int64_t c = 0; c < layout_.chunks(); ++c) {
    const ChunkBytes k = chunk_bytes(c);
    b.params += k.params;
    b.grads += k.grads;
    b.optimizer += k.optimizer;
    b.host += k.host;
  }
  if (offloaded_) {
    b.staging = offloaded_->staged_bytes();
    b.optimizer += b.staging;
    b.host += b.staging;
    b.nvme = offloaded_->file_bytes();
  }
  return b;
}

}  // namespace colossal::memory
