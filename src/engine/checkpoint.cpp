// Checkpoint save/load: see checkpoint.h.
#include "src/engine/checkpoint.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/accumulate.h>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <regex>

#include "src/core/error.h"
#include "src/core/json_value.h"
#include "src/core/text.h"
#include "src/data/tokenizer.h"
#include "models/registry.h"
#include "src/io/atomic_dir.h"

namespace fs = std::filesystem;

namespace colossal {
namespace {

constexpr const char* kRngName = "__rng_cpu__";
constexpr const char* kCudaRngName = "__rng_cuda__";   // dropout on a GPU draws from the device's generator

// The default generator of the device the parameters live on, if that is not the CPU.
std::optional<at::Generator> device_generator(const at::Tensor& any_param) {
  if (any_param.is_cpu()) return std::nullopt;
  return at::globalContext().defaultGenerator(any_param.device());
}

std::string step_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%06lld", static_cast<long long>(step));
  return buf;
}

std::map<std::string, at::Tensor> named_parameters_map(nn::Model& model) {
  std::map<std::string, at::Tensor> out;
  for (auto& item : model.named_parameters()) out.emplace(item.key(), item.value());
  return out;
}

// Rows [a, b, rest...] viewed as [b, a, rest...]: BLOOM's per-head qkv interleave (a = 3, b = H) and
// its inverse (a = H, b = 3).
at::Tensor swap_row_groups(const at::Tensor& t, int64_t a, int64_t b) {
  std::vector<int64_t> shape{a, b, t.size(0) / (a * b)};
  for (int64_t d = 1; d < t.dim(); ++d) shape.push_back(t.size(d));
  return t.reshape(shape).transpose(0, 1).reshape(t.sizes());
}

// One of our tensors (or a part of one) as HF stores it, and the shape that makes.
at::Tensor to_hf_layout(const at::Tensor& t, const nn::HfTarget& target) {
  at::Tensor out = target.interleave_heads ? swap_row_groups(t, 3, target.interleave_heads) : t;
  return target.transpose ? out.t().contiguous() : out;
}
std::vector<int64_t> hf_shape(const at::Tensor& t, const nn::HfTarget& target) {
  auto shape = t.sizes().vec();
  if (target.transpose && shape.size() == 2) std::swap(shape[0], shape[1]);
  return shape;
}
// An HF tensor already checked to have hf_shape(ours) -> our layout.
at::Tensor from_hf_layout(const at::Tensor& t, const nn::HfTarget& target) {
  at::Tensor out = target.transpose && t.dim() == 2 ? t.t() : t;
  return target.interleave_heads ? swap_row_groups(out, target.interleave_heads, 3) : out;
}

// Part i of the `parts` equal slices along dim 0 that HF stores separately (the whole when one).
at::Tensor part_of(const at::Tensor& whole, size_t i, size_t parts) {
  if (parts == 1) return whole;
  const int64_t rows = whole.size(0) / static_cast<int64_t>(parts);
  return whole.narrow(0, static_cast<int64_t>(i) * rows, rows);
}

// The stored tensor `stored` in our layout (what was read, viewed transposed or with its heads regrouped),
// after checking it has the shape and kind of values `dst` (part of one of our tensors) needs.
at::Tensor hf_part(const HfWeights& weights, const std::string& stored, const nn::HfTarget& target, const at::Tensor& dst) {
  const at::Tensor t = weights.get(stored);
  if (t.sizes() != hf_shape(dst, target))
    throw Error("checkpoint " + weights.file_of(stored) + ": tensor \"" + stored + "\" has shape " + c10::str(t.sizes()) +
                " but the model expects " + c10::str(c10::IntArrayRef(hf_shape(dst, target))));
  // Floating point converts to the parameter's precision; a quantized layer's integers must be stored as
  // exactly the integers it holds (int8, or uint8 for packed int4).
  const bool integral = !at::isFloatingType(dst.scalar_type());
  if (integral ? t.scalar_type() != dst.scalar_type() : !at::isFloatingType(t.scalar_type()))
    throw Error("checkpoint " + weights.file_of(stored) + ": tensor \"" + stored + "\" holds " + c10::toString(t.scalar_type()) +
                " values (expected " + (integral ? std::string(c10::toString(dst.scalar_type())) : "floating point") + ")");
  return from_hf_layout(t, target);
}

// The same copied into `dst`, read now and released after the copy.
void copy_hf_part(const HfWeights& weights, const std::string& stored, const nn::HfTarget& target, at::Tensor dst) {
  dst.copy_(hf_part(weights, stored, target, dst));
}

// A 1D tensor-parallel rank's piece of one of our floating-point tensors, read from the mapped files
// so that only its rows are touched where the layout keeps them together (a vocabulary range, a row
// layer's input rows, OPT's q, k and v each cut alike, BLOOM's fused heads: rows of whole heads in
// its interleaved layout); false when the layout has no such view (the caller reads whole tensors).
bool read_piece(const HfWeights& weights, const std::map<std::string, std::string>& stored, const nn::HfTarget& target,
                const nn::ShardSpec& shard, const at::Tensor& piece) {
  if (shard.cuts.size() != 1 || !at::isFloatingType(piece.scalar_type())) return false;
  const nn::ShardCut& c = shard.cuts[0];
  const auto names = static_cast<int64_t>(target.names.size());
  if (c.dim < 0 || (names > 1 && (names != c.parts || c.dim != 0)) || (target.interleave_heads && (names != 1 || c.dim != 0 || c.parts != 3)))
    return false;
  const std::vector<int64_t> whole = shard.full_shape(piece.sizes());
  std::vector<at::Tensor> sources;
  for (int64_t i = 0; i < names; ++i) {
    auto it = stored.find(target.names[static_cast<size_t>(i)]);
    if (it == stored.end()) throw Error("checkpoint " + weights.describe() + ": tensor \"" + target.names[static_cast<size_t>(i)] + "\" is missing");
    at::Tensor t = weights.map(it->second);
    std::vector<int64_t> expected = whole;
    expected[0] /= names;   // each name one segment
    if (t.sizes() != hf_shape(at::empty(expected, at::kMeta), target) || !at::isFloatingType(t.scalar_type())) return false;   // the whole read reports it
    sources.push_back(t);
  }
  if (target.interleave_heads) {   // [heads, 3, D] rows: this rank's heads are rows together, then our [3, heads, D]
    const at::Tensor rows = sources[0].narrow(0, c.index * (whole[0] / c.count), whole[0] / c.count);
    piece.copy_(swap_row_groups(rows, target.interleave_heads / c.count, 3));
    return true;
  }
  if (names == 1) {
    piece.copy_(shard.local_of(from_hf_layout(sources[0], target)));
    return true;
  }
  const nn::ShardSpec each = nn::ShardSpec::along(0, c.count, c.index);   // OPT's q, k, v: each cut alike
  for (int64_t i = 0; i < names; ++i) part_of(piece, static_cast<size_t>(i), static_cast<size_t>(names)).copy_(each.local_of(from_hf_layout(sources[static_cast<size_t>(i)], target)));
  return true;
}

void rotate(const std::string& dir, int64_t keep_last, const std::string& keep) {
  static const std::regex pattern("step-[0-9]+");
  std::vector<std::string> steps;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::string name = e.path().filename().string();
    if (e.is_directory() && std::regex_match(name, pattern)) steps.push_back(name);
  }
  std::sort(steps.begin(), steps.end());   // zero-padded: lexical order is step order
  int64_t excess = static_cast<int64_t>(steps.size()) - keep_last;
  for (int64_t i = 0; i < excess; ++i)
    if (steps[i] != keep) fs::remove_all(fs::path(dir) / steps[i]);
}

// A JSON object from a checkpoint file; the error names the file and the byte where parsing stopped.
nlohmann::json read_json(const std::string& path) {
  nlohmann::json j = parse_json(read_text_file(path), "checkpoint file " + path);
  if (!j.is_object()) throw Error("checkpoint file " + path + " holds " + std::string(j.type_name()) + ", not a JSON object");
  return j;
}

// trainer_state.json's counters: whole numbers >= 0 that fit int64 (a negative or fractional step
// would resume with a wrong schedule); the losses are numbers.
TrainerState parse_trainer_state(const nlohmann::json& s, const std::string& path) {
  auto count = [&](const char* key) -> int64_t {
    if (!s.contains(key)) throw Error("checkpoint file " + path + ": \"" + key + "\" is missing");
    const auto n = whole_number(s[key]);
    if (!n || *n > static_cast<uint64_t>(INT64_MAX))
      throw Error("checkpoint file " + path + ": \"" + key + "\" = " + s[key].dump() + " (expected a whole number >= 0)");
    return static_cast<int64_t>(*n);
  };
  auto number = [&](const char* key, double fallback) -> double {
    if (!s.contains(key)) return fallback;
    if (s[key].is_null()) return std::numeric_limits<double>::quiet_NaN();   // how JSON stores a NaN loss
    if (!s[key].is_number()) throw Error("checkpoint file " + path + ": \"" + key + "\" = " + s[key].dump() + " (expected a number)");
    return s[key].get<double>();
  };
  TrainerState st;
  st.step = count("step");
  if (s.contains("samples_seen") || !s.contains("loader_position")) st.samples_seen = count("samples_seen");
  else st.legacy_batches = count("loader_position");
  if (s.contains("world_size")) st.world_size = count("world_size");
  st.tokens_seen = count("tokens_seen");
  st.train_loss = number("train_loss", 0.0);
  st.eval_loss = number("eval_loss", -1.0);
  st.eval_accuracy = number("eval_accuracy", -1.0);
  if (auto k = s.find("kernel_choices"); k != s.end()) {
    if (!k->is_object()) throw Error("checkpoint file " + path + ": kernel_choices must be an object");
    for (const auto& [key, v] : k->items()) {
      if (!v.is_string() || (v != "fused" && v != "aten"))
        throw Error("checkpoint file " + path + ": kernel_choices[\"" + key + "\"] must be \"fused\" or \"aten\"");
      st.kernel_choices[key] = v.get<std::string>();
    }
  }
  return st;
}

bool has_weights(const fs::path& dir) {
  for (const char* name : {"model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json"})
    if (fs::is_regular_file(dir / name)) return true;
  return false;
}

// Our config.json over the one the run started from: fields we do not write stay, and so do the
// special token ids and class names (the family's defaults must not replace a model's own). The weights are saved
// in fp32, which the dtype fields say.
nlohmann::json config_for_save(nlohmann::json ours, const nlohmann::json& base) {
  if (!base.is_object()) return ours;
  for (const auto& [key, value] : base.items()) {
    const bool own = key == "bos_token_id" || key == "eos_token_id" || key == "pad_token_id" || key == "decoder_start_token_id" ||
                     ((key == "id2label" || key == "label2id") && value.size() == ours.value(key, nlohmann::json::object()).size());
    if (!ours.contains(key) || own) ours[key] = value;
  }
  for (const char* dtype : {"dtype", "torch_dtype"})
    if (ours.contains(dtype)) ours[dtype] = "float32";
  return ours;
}

}  // namespace

// One of our tensors as the HF tensors that store it: split into its parts along dim 0 and
// transposed where the name map says, each named with `suffix` appended.
std::vector<NamedTensor> hf_pieces(const nn::HfTarget& target, const at::Tensor& t, const std::string& suffix) {
  std::vector<NamedTensor> out;
  for (size_t i = 0; i < target.names.size(); ++i)
    out.push_back({target.names[i] + suffix, to_hf_layout(part_of(t, i, target.names.size()), target).contiguous()});
  return out;
}

std::vector<SafetensorsWriter::Entry> hf_entries(const nn::HfTarget& target, at::IntArrayRef shape, at::ScalarType dtype,
                                                 const std::string& suffix) {
  std::vector<SafetensorsWriter::Entry> out;
  for (const auto& piece : hf_pieces(target, at::empty(shape, at::TensorOptions().dtype(dtype).device(at::kMeta)), suffix))
    out.push_back({piece.name, dtype, piece.tensor.sizes().vec()});
  return out;
}

std::vector<NamedTensor> export_model_state(nn::Model& model) {
  std::vector<NamedTensor> out;
  for (auto& item : model.named_parameters())
    for (auto& piece : hf_pieces(model.hf_names().to_hf(item.key()), item.value().detach(), "")) out.push_back(std::move(piece));
  return out;
}

namespace {

// Canonical HF name -> the name in the files, for every stored tensor; an Error for a tensor that is
// neither one of the model's nor one HF saves redundantly.
std::map<std::string, std::string> stored_names(const nn::Model& model, const HfWeights& weights) {
  const auto& names = model.hf_names();
  std::map<std::string, at::Tensor> params;
  for (const auto& item : model.named_parameters()) params.emplace(item.key(), item.value());
  std::map<std::string, std::string> stored;
  for (const auto& name : weights.names()) {
    const auto source = names.from_hf(name);
    if (!source) {
      if (names.ignored(names.canonical(name))) continue;
      throw Error("checkpoint " + weights.file_of(name) + ": unexpected tensor \"" + name + "\" (a different model family?)");
    }
    if (!params.count(source->ours))
      throw Error("checkpoint " + weights.file_of(name) + ": tensor \"" + name +
                  "\" has no place in this model (more layers than the config says?)");
    stored[source->hf] = name;
  }
  return stored;
}

}  // namespace

std::map<std::string, StoredAsIs> parameters_stored_as_is(const nn::Model& model, const HfWeights& weights) {
  const auto& names = model.hf_names();
  const auto stored = stored_names(model, weights);
  std::map<std::string, StoredAsIs> out;
  for (const auto& item : model.named_parameters()) {
    const at::Tensor& p = item.value();
    const auto target = names.to_hf(item.key());
    if (target.names.size() != 1 || target.interleave_heads || item.shard().split()) continue;
    auto it = stored.find(target.names[0]);
    if (it == stored.end()) continue;
    const SafetensorsEntry* e = weights.entry(it->second);
    const auto size = static_cast<uint64_t>(c10::elementSize(p.scalar_type()));
    if (!e || e->dtype != p.scalar_type() || e->shape != hf_shape(p, target) || e->offset % size != 0) continue;
    out.emplace(item.key(), StoredAsIs{weights.file_of(it->second), e->offset, e->bytes, e->shape, target.transpose && p.dim() == 2});
  }
  return out;
}

void read_model_state(const nn::Model& model, const HfWeights& weights,
                      const std::function<void(const std::string& name, const at::Tensor& value)>& take,
                      const std::function<bool(const std::string& name)>& only, bool views) {
  const auto& names = model.hf_names();
  const auto stored = stored_names(model, weights);
  at::NoGradGuard no_grad;
  at::Tensor spare;
  for (const auto& item : model.named_parameters()) {   // in the model's order, one tensor at a time
    if (only && !only(item.key())) continue;
    const auto target = names.to_hf(item.key());
    // fp32 whatever the parameter computes in: a chunk store's master weights take it at full precision
    // (a quantized layer's integers keep their own type)
    const auto dtype = at::isFloatingType(item.value().scalar_type()) ? at::kFloat : item.value().scalar_type();
    if (item.shard().split()) {   // a tensor-parallel piece: only its rows, where the files keep them together
      const at::Tensor piece = at::empty(item.value().sizes(), dtype);
      if (read_piece(weights, stored, target, item.shard(), piece)) {
        take(item.key(), piece);
        continue;
      }
    }
    if (views && target.names.size() == 1 && !target.interleave_heads && !item.shard().split()) {
      auto it = stored.find(target.names[0]);
      if (it == stored.end()) throw Error("checkpoint " + weights.describe() + ": tensor \"" + target.names[0] + "\" is missing");
      take(item.key(), hf_part(weights, it->second, target, at::empty(item.value().sizes(), item.value().options().device(at::kMeta))));
      continue;
    }
    // The whole tensor, of which a tensor-parallel layer takes its piece: in the last one's memory when
    // `take` kept nothing of it and it is as large (a model's blocks repeat their shapes), since a fresh
    // allocation of hundreds of MB costs the kernel's zeroing of every page of it.
    const auto shape = item.shard().full_shape(item.value().sizes());
    const int64_t bytes = c10::multiply_integers(shape) * static_cast<int64_t>(c10::elementSize(dtype));
    if (!spare.defined() || spare.use_count() > 1 || spare.storage().use_count() > 1 || spare.scalar_type() != dtype ||
        static_cast<int64_t>(spare.storage().nbytes()) != bytes)
      spare = at::empty(shape, dtype);
    const at::Tensor value = spare.view(shape);
    for (size_t i = 0; i < target.names.size(); ++i) {
      auto it = stored.find(target.names[i]);
      if (it == stored.end()) throw Error("checkpoint " + weights.describe() + ": tensor \"" + target.names[i] + "\" is missing");
      copy_hf_part(weights, it->second, target, part_of(value, i, target.names.size()));
    }
    take(item.key(), item.shard().local_of(value));
  }
}

void load_model_state(nn::Model& model, const HfWeights& weights) {
  auto params = named_parameters_map(model);
  read_model_state(model, weights, [&](const std::string& name, const at::Tensor& value) { params.at(name).copy_(value); });
}

void refuse_quantized_start(const nlohmann::json& config, const std::string& dir) {
  if (config.contains("quantization_config") && !config["quantization_config"].is_null())
    throw Error("model directory " + dir + " holds quantized weights (config.json: quantization_config); training and fine-tuning "
                "start from the fp32 checkpoint it was quantized from");
}

std::shared_ptr<nn::Model> load_pretrained(const std::string& dir, nn::LayerFactory& factory) {
  const fs::path config = fs::path(dir) / "config.json";
  if (!fs::is_regular_file(config)) throw Error("model directory " + dir + ": config.json is missing");
  // Every parameter is read from the directory (read_model_state takes each one or throws), so none is
  // initialised first: drawing random values for all of them cost 5% of a 124M model's whole decode run.
  const nlohmann::json json = read_json(config.string());
  refuse_quantized_start(json, dir);
  auto model = build_model(model_config_from_hf(json, config.string()), factory, /*initialise=*/false);
  load_model_state(*model, HfWeights::open(dir));
  return model;
}


namespace {

// How each parameter of `model` is a piece of its whole tensor, by name.
std::map<std::string, nn::ShardSpec> shard_specs(const nn::Model& model) {
  std::map<std::string, nn::ShardSpec> out;
  for (const auto& item : model.named_parameters()) out.emplace(item.key(), item.shard());
  return out;
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
  if (!f.flush()) throw Error("cannot write " + path.string());
}

// The RNG streams a resumed run continues (the CPU generator's, and the parameters' device's).
void add_rng_state(std::vector<NamedTensor>& out, const at::Tensor& any_param) {
  auto gen = at::detail::getDefaultCPUGenerator();
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    out.push_back({kRngName, gen.get_state()});
  }
  if (auto dev = device_generator(any_param)) {
    std::lock_guard<std::mutex> lock(dev->mutex());
    out.push_back({kCudaRngName, dev->get_state()});
  }
}

}  // namespace

std::string save_checkpoint(const std::string& dir, const CheckpointSave& s, int64_t keep_last) {
  const std::string name = step_dir_name(s.state.step);
  const std::string final_path = (fs::path(dir) / name).string();
  const int64_t dp_rank = s.group ? s.group->rank() : 0, dp_ranks = s.group ? s.group->size() : 1;
  dist::Group* pp = s.pipeline_group && s.pipeline_group->size() > 1 ? s.pipeline_group : nullptr;
  const int64_t stage = pp ? pp->rank() : 0, stages = pp ? pp->size() : 1;
  // Tensor parallelism: the group's first rank gathers the split tensors' pieces and writes them whole;
  // the others write nothing. Barriers pass the data-parallel group, then the tensor-parallel one:
  // together every rank of the job.
  dist::Group* tp = s.tensor_group && s.tensor_group->size() > 1 ? s.tensor_group : nullptr;
  const bool tp_writer = !tp || tp->rank() == 0;
  auto barrier = [&](const std::string& what) {
    if (s.group) s.group->barrier(what + " of the checkpoint at step " + std::to_string(s.state.step));
    if (tp) tp->barrier(what + " of the checkpoint at step " + std::to_string(s.state.step));
    if (pp) pp->barrier(what + " of the checkpoint at step " + std::to_string(s.state.step));
  };
  const auto shards = shard_specs(*s.model);
  // A tensor of slot `name` whole: this rank's piece, or every tensor-parallel rank's gathered onto the
  // writer (undefined elsewhere).
  auto whole_of = [&](const std::string& name, const at::Tensor& piece) -> at::Tensor {
    const nn::ShardSpec& shard = shards.at(name);
    if (!tp || !shard.split()) return piece;
    const at::Tensor flat = piece.contiguous().reshape({-1});
    at::Tensor gathered = tp_writer ? at::empty({tp->size() * flat.numel()}, flat.options()) : at::Tensor();
    tp->gather(gathered, flat, 0, "checkpoint tensor " + name);
    if (!tp_writer) return {};
    std::vector<at::Tensor> pieces;
    for (int64_t r = 0; r < tp->size(); ++r) pieces.push_back(gathered.narrow(0, r * flat.numel(), flat.numel()).view(piece.sizes()));
    return shard.assemble(pieces);
  };
  // Sharded when the optimizer states are: every rank writes what it owns. Otherwise rank 0 holds
  // everything and writes it alone, as one file of each kind. Each pipeline stage writes its own files.
  const bool zero_sharded = s.strategy && s.strategy->store().stage() > 0 && dp_ranks > 1;
  const int64_t per_stage = zero_sharded ? dp_ranks : 1, ranks = stages * per_stage;
  const int64_t rank = stage * per_stage + (zero_sharded ? dp_rank : 0);   // the file this rank writes (if any)
  const bool sharded = ranks > 1;
  auto skipped = [&](const std::string& name) { return std::find(s.copies.begin(), s.copies.end(), name) != s.copies.end(); };
  const std::string tag = "step";   // a temporary name every rank can compute
  std::unique_ptr<AtomicDir> out;
  const bool root = dp_rank == 0 && stage == 0 && tp_writer;
  const bool stage_root = dp_rank == 0 && tp_writer;   // writes its stage's part of the index
  if (root) out = std::make_unique<AtomicDir>(final_path, tag);
  barrier("directory");
  const fs::path tmp(AtomicDir::temp_path(final_path, tag));
  const std::string model_file = sharded ? safetensors_shard_name("model", rank, ranks) : "model.safetensors";
  const std::string optim_file = sharded ? safetensors_shard_name("optimizer", rank, ranks) : "optimizer.safetensors";
  const auto& names = s.model->hf_names();

  const std::string steps = s.strategy ? std::to_string(s.strategy->optimizer().steps()) : "0";
  const std::string optimizer_name = s.strategy ? s.strategy->optimizer().name() : "";
  std::map<std::string, std::string> optim_meta = {{"optimizer", optimizer_name}, {"step", steps}};
  if (s.strategy)
    for (const auto& [k, v] : s.strategy->scaler_state()) optim_meta[k] = v;   // fp16's loss scale

  // This rank's tensors: the parameters it owns and their optimizer states (collective under ZeRO),
  // written into its files as for_each_owned hands them over, so no rank holds its files' contents.
  nlohmann::json weight_map = nlohmann::json::object(), state_map = nlohmann::json::object();
  if (s.strategy) {
    auto& store = s.strategy->store();
    const auto& layout = store.layout();
    const auto state_names = s.strategy->optimizer().state_names();
    const bool writes = (dp_rank == 0 || zero_sharded) && tp_writer;
    // The files' headers first, from shapes alone (meta tensors through the same HF layout), in the
    // order for_each_owned visits the tensors; then, on rank 0, frozen tensors and the RNG state.
    const auto dtype = store.master_options().dtype().toScalarType();
    std::vector<SafetensorsWriter::Entry> model_entries, state_entries;
    auto add_entries = [&](std::vector<SafetensorsWriter::Entry>& to, const nn::HfTarget& hf, const std::vector<int64_t>& shape,
                           const std::string& suffix) {
      for (auto& e : hf_entries(hf, shape, dtype, suffix)) to.push_back(std::move(e));
    };
    // Each tensor's HF names once: for this rank's headers, and on rank 0 for the index, which names
    // every tensor's file from the layout alone (each rank's share is known to all).
    std::vector<nn::HfTarget> hf_of;
    for (int64_t i = 0; i < static_cast<int64_t>(layout.slots.size()); ++i) {
      const auto& slot = layout.slots[static_cast<size_t>(i)];
      const auto& hf = hf_of.emplace_back(names.to_hf(slot.name));
      if (skipped(slot.name)) continue;
      const int64_t owner = stage * per_stage + (zero_sharded ? store.owner(i) : 0);
      if (stage_root) {
        const std::string owner_model = safetensors_shard_name("model", owner, ranks);
        const std::string owner_optim = safetensors_shard_name("optimizer", owner, ranks);
        for (const auto& n : hf.names) {
          weight_map[n] = owner_model;
          for (const auto& sn : state_names) state_map[n + "." + sn] = owner_optim;
        }
      }
      if (!writes || owner != rank) continue;
      const auto shape = shards.at(slot.name).full_shape(slot.shape);
      add_entries(model_entries, hf, shape, "");
      for (const auto& sn : state_names) add_entries(state_entries, hf, shape, "." + sn);
    }
    std::vector<NamedTensor> extra_weights, extra_states;   // each stage's first rank's (the RNG state: rank 0's)
    if (stage_root) {
      for (auto& item : s.model->named_parameters())   // frozen tensors live outside the store
        if (!store.slot_of(item.key()) && (!s.holds || s.holds(item.key())))
          for (auto& piece : hf_pieces(names.to_hf(item.key()), item.value().detach())) extra_weights.push_back(std::move(piece));
      if (root) add_rng_state(extra_states, store.params().front());
      for (const auto& w : extra_weights) model_entries.push_back({w.name, w.tensor.scalar_type(), w.tensor.sizes().vec()});
      for (const auto& w : extra_states) state_entries.push_back({w.name, w.tensor.scalar_type(), w.tensor.sizes().vec()});
      for (const auto& w : extra_weights) weight_map[w.name] = model_file;
      for (const auto& w : extra_states) state_map[w.name] = optim_file;
    }
    std::unique_ptr<SafetensorsWriter> model_out, state_out;
    if (writes) {
      model_out = std::make_unique<SafetensorsWriter>((tmp / model_file).string(), std::move(model_entries),
                                                      std::map<std::string, std::string>{{"format", "pt"}});
      state_out = std::make_unique<SafetensorsWriter>((tmp / optim_file).string(), std::move(state_entries), optim_meta);
    }
    s.strategy->for_each_owned([&](int64_t i, const at::Tensor& param, const std::vector<at::Tensor>& st) {
      const std::string& name = layout.slots[static_cast<size_t>(i)].name;
      if (skipped(name)) return;
      const at::Tensor whole = whole_of(name, param);   // collective over the tensor-parallel group
      std::vector<at::Tensor> states;
      for (const auto& t : st) states.push_back(whole_of(name, t));
      if (!tp_writer) return;
      if (!model_out) throw Error("checkpoint: rank " + std::to_string(rank) + " owns a tensor but writes no file (internal)");
      const auto& hf = hf_of[static_cast<size_t>(i)];
      for (const auto& piece : hf_pieces(hf, whole)) model_out->write(piece.name, piece.tensor);
      for (size_t k = 0; k < states.size(); ++k)
        for (const auto& piece : hf_pieces(hf, states[k], "." + state_names[k])) state_out->write(piece.name, piece.tensor);
    });
    if (writes) {
      for (const auto& w : extra_weights) model_out->write(w.name, w.tensor);
      for (const auto& w : extra_states) state_out->write(w.name, w.tensor);
      model_out->finish();
      state_out->finish();
    }
  } else if (root) {
    save_safetensors((tmp / model_file).string(), export_model_state(*s.model), {{"format", "pt"}});
  }
  // A later stage's part of the index, for rank 0 to merge (every rank writes into the same directory).
  const auto part_path = [&](int64_t k) { return tmp / ("index-of-stage-" + std::to_string(k) + ".json"); };
  if (pp && stage_root && stage > 0)
    write_text(part_path(stage), nlohmann::json{{"model", weight_map}, {"optimizer", state_map}}.dump() + "\n");
  barrier("every rank's files");

  if (root) {
    for (int64_t k = 1; pp && k < stages; ++k) {
      const auto part = nlohmann::json::parse(read_text_file(part_path(k).string()));
      weight_map.update(part.at("model"));
      state_map.update(part.at("optimizer"));
      fs::remove(part_path(k));
    }
    if (sharded) {
      const nlohmann::json meta = {{"format", "pt"}};
      write_text(tmp / "model.safetensors.index.json", nlohmann::json{{"metadata", meta}, {"weight_map", weight_map}}.dump(2) + "\n");
      write_text(tmp / "optimizer.safetensors.index.json",
                 nlohmann::json{{"metadata", optim_meta}, {"weight_map", state_map}}.dump(2) + "\n");
    }
    write_text(tmp / "config.json", config_for_save(s.model->hf_config(), s.base_config).dump(2) + "\n");
    for (const auto& [file, bytes] : s.tokenizer_files) write_text(tmp / file, bytes);
    write_text(tmp / "recipe.toml", s.recipe_toml);
    nlohmann::json state = {{"step", s.state.step},
                            {"samples_seen", s.state.samples_seen},
                            {"world_size", s.state.world_size},
                            {"tokens_seen", s.state.tokens_seen},
                            {"train_loss", s.state.train_loss},
                            {"eval_loss", s.state.eval_loss},
                            {"eval_accuracy", s.state.eval_accuracy},
                            {"has_optimizer", s.strategy != nullptr},
                            {"kernel_choices", s.state.kernel_choices}};
    write_text(tmp / "trainer_state.json", state.dump(2) + "\n");
    out->commit();
    write_file_atomic((fs::path(dir) / "latest").string(), name + "\n");
    rotate(dir, keep_last, name);
  }
  barrier("commit");
  return final_path;
}

std::string save_model_dir(const std::string& dir, nn::Model& model, const TokenizerFiles& tokenizer_files,
                           const nlohmann::json& base_config, const nlohmann::json& extra_config) {
  const auto tensors = export_model_state(model);
  std::vector<SafetensorsWriter::Entry> entries;
  for (const auto& t : tensors) entries.push_back({t.name, t.tensor.scalar_type(), t.tensor.sizes().vec()});
  return save_model_dir_streamed(
      dir, model, std::move(entries),
      [&](const TensorSink& write) {
        for (const auto& t : tensors) write(t.name, t.tensor);
      },
      std::numeric_limits<uint64_t>::max(), tokenizer_files, base_config, extra_config);
}

std::string save_model_dir_streamed(const std::string& dir, nn::Model& model, std::vector<SafetensorsWriter::Entry> entries,
                                    const std::function<void(const TensorSink& write)>& produce, uint64_t max_shard_bytes,
                                    const TokenizerFiles& tokenizer_files, const nlohmann::json& base_config,
                                    const nlohmann::json& extra_config, int64_t* files_written) {
  create_output_dir(fs::path(dir).parent_path().empty() ? "." : fs::path(dir).parent_path().string(), "--out");
  AtomicDir out(dir);
  const fs::path tmp = out.path();
  ShardedSafetensorsWriter files(tmp.string(), "model", std::move(entries), max_shard_bytes, {{"format", "pt"}});
  produce([&](const std::string& name, const at::Tensor& t) { files.write(name, t); });
  files.finish();
  if (files_written) *files_written = static_cast<int64_t>(files.files().size());
  nlohmann::json config = config_for_save(model.hf_config(), base_config);
  for (const auto& [key, value] : extra_config.items()) config[key] = value;
  write_text(tmp / "config.json", config.dump(2) + "\n");
  for (const auto& [file, bytes] : tokenizer_files) write_text(tmp / file, bytes);
  out.commit();
  return dir;
}

std::string resolve_checkpoint(const std::string& path) {
  fs::path p(path);
  if (!fs::exists(p)) throw Error("checkpoint " + path + ": no such file or directory");
  auto follow_latest = [](const fs::path& dir) -> std::string {
    std::string name = read_text_file((dir / "latest").string());
    name.erase(name.find_last_not_of(" \n\r\t") + 1);
    fs::path target = dir / name;
    if (name.empty() || !fs::is_directory(target))
      throw Error("checkpoint " + (dir / "latest").string() + " names \"" + name + "\", which does not exist");
    return target.string();
  };
  if (fs::is_regular_file(p) && p.filename() == "latest") return follow_latest(p.parent_path());
  if (fs::is_regular_file(p / "config.json") && has_weights(p)) return p.string();
  if (fs::is_regular_file(p / "latest")) return follow_latest(p);
  if (fs::is_regular_file(p / "checkpoints" / "latest")) return follow_latest(p / "checkpoints");
  throw Error("checkpoint " + path + ": not a checkpoint or model directory (expected config.json with model.safetensors, "
              "model.safetensors.index.json, pytorch_model.bin or pytorch_model.bin.index.json; a `latest` file; or checkpoints/latest)");
}

CheckpointInfo read_checkpoint_info(const std::string& dir) {
  CheckpointInfo info;
  info.dir = dir;
  const fs::path d(dir);
  info.config = read_json((d / "config.json").string());
  info.model = model_config_from_hf(info.config, (d / "config.json").string());
  info.tokenizer_files = Tokenizer::read_files(dir);   // none for models without text (ViT)
  if (fs::is_regular_file(d / "trainer_state.json")) {
    const std::string path = (d / "trainer_state.json").string();
    info.state = parse_trainer_state(read_json(path), path);
    info.has_state = true;
  }
  return info;
}

void read_hf_pieces(const nn::HfTarget& target, const std::string& suffix, const HfWeights& weights, at::Tensor whole) {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < target.names.size(); ++i) copy_hf_part(weights, target.names[i] + suffix, target, part_of(whole, i, target.names.size()));
}

void load_optimizer_state(nn::Model& model, memory::TrainStrategy& strategy, const std::string& dir) {
  const HfWeights file = HfWeights::open(dir, "optimizer");
  const std::string& path = file.describe();
  const auto& names = model.hf_names();
  auto& store = strategy.store();
  const auto state_names = strategy.optimizer().state_names();
  if (auto it = file.metadata().find("optimizer"); it != file.metadata().end() && it->second != strategy.optimizer().name())
    throw Error("checkpoint " + path + ": holds " + it->second + " state, but this run uses " + strategy.optimizer().name() +
                " (resume with the same [optim] name, or start a new run with `colossal finetune`)");
  // One tensor at a time: its whole value is read and each rank keeps its own part (of a tensor-parallel
  // layer's piece).
  const auto shards = shard_specs(model);
  for (int64_t i = 0; i < static_cast<int64_t>(store.layout().slots.size()); ++i) {
    const auto& slot = store.layout().slots[static_cast<size_t>(i)];
    const auto hf = names.to_hf(slot.name);
    const nn::ShardSpec& shard = shards.at(slot.name);
    for (size_t k = 0; k < state_names.size(); ++k) {
      at::Tensor whole = at::empty(shard.full_shape(slot.shape), store.master_options());
      read_hf_pieces(hf, "." + state_names[k], file, whole);
      strategy.load_state(i, k, shard.local_of(whole).contiguous());
    }
  }
  auto it = file.metadata().find("step");
  if (it == file.metadata().end()) throw Error("checkpoint " + path + ": metadata has no step count");
  const auto steps = parse_whole(it->second);
  if (!steps || *steps > static_cast<uint64_t>(INT64_MAX))
    throw Error("checkpoint " + path + ": metadata step = \"" + it->second + "\" (expected a whole number >= 0)");
  strategy.optimizer().set_steps(static_cast<int64_t>(*steps));
  strategy.load_scaler_state(file.metadata(), path);
  // The CPU generator's state is required: without it the resumed run would draw a different data
  // order and dropout stream than the uninterrupted one. Its size is checked before LibTorch sees it.
  if (!file.contains(kRngName))
    throw Error("checkpoint " + path + ": \"" + std::string(kRngName) + "\" (the random generator's state) is missing");
  {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    const at::Tensor saved = file.get(kRngName);
    const at::Tensor current = gen.get_state();
    if (saved.scalar_type() != current.scalar_type() || saved.numel() != current.numel())
      throw Error("checkpoint " + path + ": \"" + std::string(kRngName) + "\" holds " + std::to_string(saved.numel()) + " " +
                  c10::toString(saved.scalar_type()) + " values, expected " + std::to_string(current.numel()) + " " +
                  c10::toString(current.scalar_type()));
    gen.set_state(saved);
  }
  // A run resumed on the device it was saved from continues its dropout stream; across devices the
  // streams differ anyway, so the saved one is left unused.
  auto dev = device_generator(store.params().front());
  if (dev && file.contains(kCudaRngName)) {
    std::lock_guard<std::mutex> lock(dev->mutex());
    dev->set_state(file.get(kCudaRngName));
  }
}

}  // namespace colossal
