// Building a training run: see train_plan.h. The steps below run in this order on every rank.
#include "src/engine/train_plan.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include <cstdlib>
#include <filesystem>
#include <tuple>
#include <spdlog/spdlog.h>

#include "src/core/device.h"
#include "src/core/error.h"
#include "src/core/log.h"
#include "src/core/text.h"
#include "src/dist/launch_env.h"
#include "src/engine/activation_plan.h"
#include "src/engine/tensor_split.h"
#include "models/registry.h"
#include "src/io/atomic_dir.h"
#include "src/memory/zero_strategy.h"
#include "src/nn/kernel_choice.h"
#include "src/optim/factory.h"
#include "src/parallel/sequence_attention.h"
#include "src/parallel/tensor_parallel_1d.h"
#include "src/parallel/tensor_parallel_2d.h"
#include "src/parallel/tensor_parallel_3d.h"

namespace fs = std::filesystem;

namespace colossal {
namespace {

// Starting from a directory keeps its architecture; a recipe that names a different shape is an error.
ModelConfig finetune_model_config(const Recipe& r, const ModelConfig& from_ckpt, const std::string& ckpt) {
  ModelConfig m = from_ckpt;
  m.from = r.model.from;
  auto check = [&](const char* key, const auto& recipe_value, const auto& ckpt_value) {
    if (r.locations.count(std::string("model.") + key) && recipe_value != ckpt_value)
      throw RecipeError(r.where(std::string("model.") + key),
                        "= " + fmt::format("{}", recipe_value) + " but checkpoint " + ckpt + " has " + fmt::format("{}", ckpt_value) +
                            " (starting from a model keeps its architecture; remove the key)");
  };
  check("family", r.model.family, m.family);
  check("n_layer", r.model.n_layer, m.n_layer);
  check("n_head", r.model.n_head, m.n_head);
  check("n_embd", r.model.n_embd, m.n_embd);
  check("block_size", r.model.block_size, m.block_size);
  check("vocab_size", r.model.vocab_size, m.vocab_size);
  if (r.locations.count("model.dropout")) m.dropout = r.model.dropout;   // else the directory's own
  return m;
}

}  // namespace

void check_device_budget(const Recipe& r, int64_t parameters, int64_t dp) {
  if (r.memory.device_memory_limit_gb <= 0) return;
  const double need = minimum_device_bytes(r, parameters, dp), limit = r.memory.device_limit_bytes();
  if (need <= limit) return;
  throw RecipeError(r.where("memory.device_memory_limit_gb"),
                    "= " + fmt::format("{}", r.memory.device_memory_limit_gb) + " (" + human_bytes(limit) +
                        ") is too small for even one block: the device needs at least " + human_bytes(need) +
                        (r.memory.placement == "device" ? " with every shard and optimizer state on it (placement = \"device\")"
                                                        : " (the embeddings and head whole with their gradient, two blocks' chunks and "
                                                          "one micro-batch's activations)") +
                        "; raise it, or lower train.batch_size or train.seq_len");
}

namespace {

// A sequence split the model and the batch allow, refused with the key at fault and what would work.
void check_sequence_split(const Recipe& r) {
  const int64_t sp = r.parallel.sequence;
  const ModelConfig& m = r.model;
  const std::string head = r.where("parallel.sequence") + " = " + std::to_string(sp) + ": ";
  const bool images = model_task(m) == "image_classification";   // ViT pads its sequence of patches to whole chunks
  // Hidden dropout works on each rank's tokens of the whole sequence's masks; attention's probabilities
  // never exist whole under ring attention, so their dropout is not built.
  if (m.attention_dropout() > 0)
    throw Error(r.where(m.attn_dropout < 0 ? "model.dropout" : "model.attn_dropout") + ": dropout of attention probabilities under "
                "sequence parallelism is not built yet (set model.attn_dropout = 0 to keep the hidden dropout of " + format_number(m.dropout) +
                ", or sequence = 1)");
  const auto mode = parallel::parse_sequence_mode(r.parallel.sequence_mode);
  const int64_t chunks = mode == parallel::SequenceMode::ring ? 2 * sp : sp, t = r.train.seq_len;
  if (!images && t % chunks != 0)
    throw Error(r.where("train.seq_len") + " = " + std::to_string(t) + " does not cut into " + std::to_string(chunks) +
                " equal chunks for sequence = " + std::to_string(sp) +
                (mode == parallel::SequenceMode::ring ? " under ring attention (2 zigzag chunks a rank)" : "") + " (use a multiple of " +
                std::to_string(chunks) + ")");
  const int64_t heads = m.n_head / r.parallel.tensor;   // each tensor-parallel rank's
  if (mode == parallel::SequenceMode::all_to_all && heads % sp != 0)
    throw Error(r.where("parallel.sequence_mode") + " = \"all_to_all\" trades the sequence split for a head split, and " +
                std::to_string(heads) + " heads" + (r.parallel.tensor > 1 ? " per tensor-parallel rank" : "") +
                " do not divide among sequence = " + std::to_string(sp) + " ranks (use split_gather or ring)");
}

// Megatron-style sequence parallelism: a 1D tensor group whose size divides every sample's tokens.
void check_tensor_sequence(const Recipe& r) {
  const std::string head = r.where("parallel.tensor_sequence") + " = true: ";
  if (r.parallel.tensor < 2)
    throw Error(head + "splits the blocks' tokens among the tensor-parallel ranks, and tensor = " + std::to_string(r.parallel.tensor) +
                " (set tensor > 1, or tensor_sequence = false)");
  if (r.parallel.tensor_mode != "1d")
    throw Error(head + "is Megatron's split of 1D tensor parallelism, and tensor_mode = \"" + r.parallel.tensor_mode +
                "\" (use \"1d\")");
  if (r.parallel.sequence > 1)
    throw Error(head + "with sequence = " + std::to_string(r.parallel.sequence) + " is not built yet (use one of them)");
  const int64_t tokens = tokens_per_sample(r), t = r.parallel.tensor;
  const bool images = model_task(r.model) == "image_classification";
  if (tokens % t != 0)
    throw Error(head + "each sample's " + std::to_string(tokens) + " tokens" + (images ? " (patches and the class token)" : "") +
                " do not split among tensor = " + std::to_string(t) + " ranks" +
                (images ? "" : " (use a train.seq_len that is a multiple of " + std::to_string(t) + ")"));
}

// A grid of side q the model and the batch divide (2d: q x q; 2.5d: `depth` of them; 3d: a cube, whose
// batches are cut into q^2 row blocks), refused with the key at fault.
void check_grid_split(const Recipe& r, int64_t q, int64_t depth) {
  const ModelConfig& m = r.model;
  const std::string mode = r.parallel.tensor_mode;
  const std::string head = r.where("parallel.tensor_mode") + " = \"" + mode + "\": ";
  if (r.parallel.sequence > 1) throw Error(head + mode + " with sequence parallelism is not built yet (use \"1d\" with sequence)");
  const bool cube = mode == "3d";
  const int64_t pieces = cube ? q * q : q;   // 3d cuts every dense layer's output features q^2 ways
  const std::string grid = cube ? std::to_string(q) + " x " + std::to_string(q) + " x " + std::to_string(q)
                                : (depth > 1 ? std::to_string(depth) + " x " : "") + std::to_string(q) + " x " + std::to_string(q);
  // The stream's features are cut q ways (so every width outside the blocks), a block's dense layers'
  // outputs `pieces` ways, heads q ways, the tied vocabulary q ways.
  std::vector<std::tuple<std::string, int64_t, int64_t>> sizes{
      {"n_head", m.n_head, q}, {"n_embd", m.n_embd, pieces}, {"n_inner", m.n_inner > 0 ? m.n_inner : 4 * m.n_embd, pieces}};
  if (model_task(m) != "image_classification") sizes.emplace_back("vocab_size", m.vocab_size, q);
  if (m.family == "opt" && m.embed_dim > 0) sizes.emplace_back("embed_dim", m.embed_dim, q);
  for (const auto& [key, n, by] : sizes)
    if (n % by != 0)
      throw Error(r.where("parallel.tensor") + " = " + std::to_string(r.parallel.tensor) + " (" + grid + ") does not divide the model's " +
                  key + " = " + std::to_string(n) + " into " + std::to_string(by) + " pieces");
  if (cube) depth = q;   // a cube's q^2 row blocks
  if (r.train.batch_size % (q * depth) != 0)
    throw Error(r.where("train.batch_size") + " = " + std::to_string(r.train.batch_size) + ": the " + mode + " grid cuts each batch into " +
                std::to_string(q * depth) + " row blocks (use a multiple of " + std::to_string(q * depth) + ")");
}

}  // namespace

// Dimensions whose layers are not built yet are refused here, by name, rather than run as something else.
dist::MeshShape check_parallel_recipe(const Recipe& r, int64_t world) {
  const dist::MeshShape shape = dist::resolve_mesh(r, world);
  const auto& grid = shape.tensor_grid;
  if (r.parallel.tensor > 1 && !grid.empty()) check_grid_split(r, grid.back(), r.parallel.tensor_mode == "2.5d" ? grid[0] : 1);
  else if (r.parallel.tensor > 1) check_tensor_split(r.model, r.parallel.tensor, r.where("parallel.tensor"));
  if (r.parallel.sequence > 1) check_sequence_split(r);
  if (r.parallel.tensor_sequence) check_tensor_sequence(r);
  // A recomputed block replays the default generator's draws; a split attention's own dropout stream
  // (nn::RandomStream) would draw new masks in the rerun.
  if (r.memory.activation_checkpoint != "none" && r.parallel.tensor > 1 && r.model.attention_dropout() > 0)
    throw Error(r.where("memory.activation_checkpoint") + " = \"" + r.memory.activation_checkpoint +
                "\" with tensor parallelism and attention dropout is not built yet (its per-rank dropout streams are not "
                "replayed; set model.attn_dropout = 0, or activation_checkpoint = \"none\")");
  if (r.parallel.pipeline > 1) check_pipeline_recipe(r);
  return shape;
}

namespace {

// Step 1: the job. Threads first (before any ATen work starts its pool), then the rendezvous.
std::unique_ptr<dist::Runtime> join_job(const Recipe& r, const TrainOptions& opt, const dist::WorkerEnv& env,
                                        c10::Device& device) {
  const dist::MeshShape shape = check_parallel_recipe(r, env.world);
  if (device.is_cpu()) dist::use_worker_threads(env);
  set_log_rank(env.rank, env.world);
  dist::JoinOptions jo;
  jo.timeout_s = r.parallel.timeout_s;
  jo.iface = opt.iface;
  jo.backend = r.parallel.backend;
  jo.cuda = device.is_cuda();
  jo.cuda_index = device.is_cuda() && device.has_index() ? device.index() : 0;
  if (r.parallel.backend == "nccl" && !device.is_cuda())
    throw Error(r.where("parallel.backend") + " = \"nccl\" needs train.device = \"cuda\" (NCCL reduces GPU tensors; use \"gloo\" on CPU)");
  auto rt = dist::Runtime::join(env, shape, jo);
  if (rt->world() > 1)
    spdlog::info("joined as {} of {} ({} launch, {} backend, mesh {}, {} thread(s) per rank)", rt->who(rt->rank()),
                 rt->world(), env.source, rt->backend_name(), shape.describe(), at::get_num_threads());
  return rt;
}

// Step 2: data. Rank 0 builds what the task's data is missing while the others wait, then all read it.
void load_data(TrainPlan& p) {
  if (p.is_root()) p.task->prepare_data();
  p.runtime->world_group().barrier("waiting for rank 0 to prepare the data");
  p.task->load_data();
}

// The parallel layout: the factory of the recipe's tensor mode (each rank allocating its pieces), with
// attention over a split sequence; what part of every batch this rank then takes (p.grid_rows,
// p.sequence).
std::unique_ptr<nn::LayerFactory> layout_factory(TrainPlan& p) {
  const Recipe& r = p.recipe;
  dist::Runtime& rt = *p.runtime;
  std::unique_ptr<nn::LayerFactory> factory;
  dist::Group& tp = rt.group(dist::Dim::tp);
  const auto& grid = rt.mesh().shape().tensor_grid;
  if (tp.size() > 1 && r.parallel.tensor_mode == "3d") {   // a cube: batches are cut into q^2 row blocks
    const std::array<dist::Group*, 3> axes{&rt.tensor_axis(0), &rt.tensor_axis(1), &rt.tensor_axis(2)};
    auto cube = std::make_unique<parallel::TensorParallel3d>(axes, nn::ParamStorage::deferred, static_cast<uint64_t>(r.train.seed));
    p.grid_rows = {parallel::TensorParallel3d::row_block(axes), axes[0]->size() * axes[0]->size()};
    p.row_groups = cube->batch_groups();
    factory = std::move(cube);
  } else if (tp.size() > 1 && !grid.empty()) {   // 2d (2.5d: grids of it in depth): batches are cut by the grids' rows
    const size_t a = grid.size() == 3 ? 1 : 0;   // the column's axis; 2.5d's depth is axis 0
    dist::Group* depth = grid.size() == 3 ? &rt.tensor_axis(0) : nullptr;
    auto grid2 = std::make_unique<parallel::TensorParallel2d>(rt.tensor_axis(a), rt.tensor_axis(a + 1), nn::ParamStorage::deferred, depth,
                                                              static_cast<uint64_t>(r.train.seed));
    const int64_t layer = depth ? depth->rank() : 0, layers = depth ? depth->size() : 1;
    p.grid_rows = {layer * rt.tensor_axis(a).size() + rt.tensor_axis(a).rank(), layers * rt.tensor_axis(a).size()};
    p.row_groups = grid2->batch_groups();
    factory = std::move(grid2);
  } else if (tp.size() > 1) {
    auto split = std::make_unique<parallel::TensorParallel1d>(tp, nn::ParamStorage::deferred, static_cast<uint64_t>(r.train.seed));
    split->split_block_tokens(r.parallel.tensor_sequence);
    factory = std::move(split);
  } else {
    factory = std::make_unique<nn::LayerFactory>(nn::ParamStorage::deferred);
  }
  dist::Group& sp = rt.group(dist::Dim::sp);
  if (sp.size() > 1) {   // attention over the split sequence; every other layer works on this rank's tokens
    const auto mode = parallel::parse_sequence_mode(r.parallel.sequence_mode);
    factory->set_sequence_attention(parallel::make_sequence_attention(mode, sp));
    p.sequence = parallel::sequence_layout(mode, sp);
  }
  return factory;
}

// Step 3: the model's structure, parameters deferred: no memory until the chunk store gives it (step 4).
void build_model_shapes(TrainPlan& p) {
  const Recipe& r = p.recipe;
  nn::set_kernel_policy({nn::parse_kernel_path(r.kernels.attention), nn::parse_kernel_path(r.kernels.gelu),
                         nn::parse_kernel_path(r.kernels.gemv), nn::parse_kernel_path(r.kernels.layer_norm),
                         nn::parse_kernel_path(r.kernels.gemm)});
  // Later runs start with the first one's choices: no timing at start-up (14 of the 34 s of a 124M
  // run's first step on a 2-core Xeon), and the same kernels from run to run rather than a new draw
  // of the machine's noise. A resumed run's own choices (step 6) replace these.
  if (kernel_cache_path()) p.kernel_cache = std::make_unique<KernelCacheSession>();
  auto factory = layout_factory(p);
  p.model = build_model(r.model, *factory);
  p.task->check_model(*p.model);
  p.model->train();
  if (p.runtime->group(dist::Dim::pp).size() > 1) {   // this rank's stages: the parameters it does not hold stay deferred
    p.pipeline = std::make_unique<PipelineRunner>(r, *p.model, *p.runtime, *p.task, p.device);
    spdlog::info("{}", p.pipeline->describe());
  }
}

// The compute dtype the recipe asks for (undefined: the model's own, fp32).
std::optional<at::ScalarType> compute_dtype(const PrecisionConfig& c) {
  if (c.dtype == "bf16") return at::kBFloat16;
  if (c.dtype == "fp16") return at::kHalf;
  return std::nullopt;
}

// The recipe's placement ([memory] placement, offload_* = "cpu", the budgets) for the chunk store.
// "auto" has something to decide only under ZeRO-3 with a device budget: one given, or on a GPU 90% of
// its memory. On a CPU without one, the device and the host are one memory and ZeRO-3 stays as it is.
memory::PlacementOptions resolve_placement(const Recipe& r, const c10::Device& device, std::shared_ptr<memory::AllocationCounter> counter) {
  const auto& m = r.memory;
  memory::PlacementOptions o;
  o.device_limit = static_cast<int64_t>(m.device_limit_bytes());
  o.host_limit = static_cast<int64_t>(m.host_limit_bytes());
  if (m.placement == "cpu") o.mode = memory::PlacementMode::cpu;
  if (m.placement == "auto" && m.zero == 3 && (o.device_limit > 0 || !device.is_cpu())) {
    o.mode = memory::PlacementMode::automatic;
    if (o.device_limit == 0) o.device_limit = static_cast<int64_t>(0.9 * static_cast<double>(device_total_bytes(device)));
  }
  const bool offloading = o.mode != memory::PlacementMode::device;   // cpu, and auto's first step
  using memory::Residence;
  o.homes.params = m.offload_params == "cpu" || offloading ? Residence::host : Residence::device;
  o.homes.states = m.offload_optimizer == "cpu" || offloading ? Residence::host : Residence::device;
  o.keep_params_on_host = m.offload_params == "cpu";
  o.keep_states_on_host = m.offload_optimizer == "cpu";
  if (o.device_limit > 0 && device.is_cpu()) o.counter = std::move(counter);
  return o;
}

// Step 4: memory layout and data parallelism: the chunk store owns parameters, gradients and optimizer
// states at the recipe's ZeRO stage, and the strategy reduces gradients across the data-parallel ranks.
void apply_memory(TrainPlan& p) {
  const Recipe& r = p.recipe;
  dist::Group& dp = p.runtime->replicas();   // the ranks holding the same weights: dp, and sp when split
  memory::ZeroOptions zo;
  zo.stage = static_cast<int>(r.memory.zero);
  zo.chunk_numel = memory::choose_chunk_numel(memory::chunk_specs(*p.model), r.memory.chunk_size_mb, dp.size(), zo.stage);
  zo.weight_decay = r.optim.weight_decay;
  zo.compute = compute_dtype(r.precision);
  if (r.precision.dtype == "fp16")
    zo.loss_scale = memory::LossScaleOptions{r.precision.initial_scale, r.precision.growth_factor, r.precision.backoff_factor,
                                             r.precision.growth_interval};
  zo.device = p.device;
  if (r.memory.offload_optimizer == "nvme") zo.offload_dir = r.memory.nvme_path;
  zo.offload_params = r.memory.offload_params == "nvme";
  zo.placement = resolve_placement(r, p.device, p.counter);
  zo.compact_grads = compact_gradient_shards(r, zo.placement.homes.states == memory::Residence::host || !zo.offload_dir.empty());
  // `colossal profile` measures the update as a phase of its own, so there it runs in place.
  zo.overlap_update = p.tracer || r.memory.overlap_update == "off" ? memory::OverlapUpdate::off
                      : r.memory.overlap_update == "on"            ? memory::OverlapUpdate::on
                                                                   : memory::OverlapUpdate::automatic;
  zo.tensor_group = &p.runtime->group(dist::Dim::tp);
  if (p.pipeline) {
    zo.pipeline_group = &p.runtime->group(dist::Dim::pp);
    if (p.pipeline->last() && !p.pipeline->first()) zo.pipeline_copies = p.pipeline->tied();   // the first stage counts them
  }
  p.strategy = std::make_unique<memory::ZeroStrategy>(*p.model, zo, dp, optim::make_optimizer(r.optim));
  // The block-hook chain: ZeRO-3's gather and release, then the profiler's tracer, which sees each block
  // with its chunks in place (recompute will go between them).
  auto chain = std::make_shared<nn::BlockHooks>();
  if (auto hook = p.strategy->block_hook()) chain->add(hook);
  // Blocks whose activations backward recomputes ("auto" measures and chooses once the weights are in).
  chain->set_recompute(fixed_recompute_mask(r.memory, static_cast<int64_t>(p.model->blocks().size())));
  if (p.tracer) {
    p.tracer->attach(p.strategy->store());
    chain->add(p.tracer);
  }
  if (p.pipeline) chain->set_stage(p.pipeline->port());
  if (!chain->empty() || r.memory.activation_checkpoint == "auto") p.model->set_block_hooks(chain);
  p.hooks = chain;
  if (p.dp_size > 1 || zo.stage > 0 || zo.compute || !zo.offload_dir.empty()) spdlog::info("{}", p.strategy->describe());
  if (zo.placement.mode == memory::PlacementMode::automatic && r.memory.device_memory_limit_gb == 0)
    spdlog::info("placement auto: a device budget of {} (90% of {})", human_bytes(static_cast<double>(zo.placement.device_limit)),
                 describe_device(p.device));
}

// Step 5: the parameters' values, streamed one tensor at a time into what each rank holds of it: from
// the directory the run starts from or resumes, else drawn from the seed by the model's init rules.
// Every rank computes the same values (the same seed, the same files), so nothing is broadcast and no
// rank holds the whole model (ZeRO-3) or a second copy of it.
void fill_parameters(TrainPlan& p, const std::string& from, bool resuming) {
  memory::ChunkStore& store = p.strategy->store();
  auto take = [&](const std::string& name, const at::Tensor& value) {
    if (p.pipeline && !p.pipeline->holds(name)) return;   // another stage's (drawn all the same: every rank draws the same stream)
    const auto slot = store.slot_of(name);
    if (!slot) throw Error("parameter \"" + name + "\" is not in the chunk store (frozen parameters are not supported yet)");
    store.write(*slot, value);
  };
  at::manual_seed(static_cast<uint64_t>(p.recipe.train.seed));   // the init draws, then dropout and data
  if (from.empty()) {
    nn::for_each_initial_value(*p.model, take);
    return;
  }
  std::function<bool(const std::string&)> only;   // a pipeline stage reads its own parameters
  if (p.pipeline) only = [&](const std::string& name) { return p.pipeline->holds(name); };
  read_model_state(*p.model, HfWeights::open(from), take, only);
  if (!resuming) spdlog::info("initialised from {}", from);
}

// The checkpoint a resume continues, checked against the recipe before anything is built from it.
std::string resume_checkpoint(TrainPlan& p) {
  const Recipe& r = p.recipe;
  const TrainOptions& opt = p.options;
  const std::string from = resolve_checkpoint(opt.resume_from.empty() ? r.checkpoint.dir : opt.resume_from);
  auto info = read_checkpoint_info(from);
  if (!info.has_state)
    throw Error("checkpoint " + from + ": trainer_state.json is missing, so the step, data position and schedule "
                "cannot be resumed (to start a new run from these weights use `colossal finetune`)");
  const ModelConfig& m = r.model;
  // Sizes and the parameter count, through the family's own reading of both (a family may derive
  // [model] keys it does not take from the recipe, as ViT's sequence length from its patches).
  if (info.model.family != m.family || info.model.n_layer != m.n_layer || info.model.n_head != m.n_head ||
      info.model.n_embd != m.n_embd || count_parameters(info.model) != count_parameters(m))
    throw Error("checkpoint " + from + " holds a different model than the recipe (resume needs the same [model])");
  if (info.tokenizer_files != p.task->tokenizer_files())
    throw Error("checkpoint " + from + " was trained with a different tokenizer than " + p.tokenizer_path);
  p.base_config = info.config;   // what the run started from keeps its fields in every save
  p.state = info.state;
  if (p.state.legacy_batches >= 0) {   // written by one process, counting its batches
    if (p.state.legacy_batches > INT64_MAX / r.train.batch_size)
      throw Error("checkpoint " + from + "/trainer_state.json: loader_position = " + std::to_string(p.state.legacy_batches) +
                  " batches of " + std::to_string(r.train.batch_size) + " overflow the sample count (expected at most " +
                  std::to_string(INT64_MAX / r.train.batch_size) + ")");
    p.state.samples_seen = p.state.legacy_batches * r.train.batch_size;
  }
  return from;
}

// Step 6: the resumed optimizer state (states, step count, loss scale, RNG), the same on every rank.
void resume(TrainPlan& p, const std::string& from) {
  load_optimizer_state(*p.model, *p.strategy, from);   // also restores the RNG state
  nn::restore_kernel_choices(p.state.kernel_choices);
  spdlog::info("resumed from {} at step {} ({} samples seen{})", from, p.state.step, p.state.samples_seen,
               p.state.world_size != p.dp_size ? ", saved by " + std::to_string(p.state.world_size) + " rank(s), now " +
                                                     std::to_string(p.dp_size)
                                               : std::string());
}

TaskData task_data(const EffectiveRecipe& e, int64_t dp_rank, int64_t dp_size) {
  return TaskData{e.recipe, e.tokenizer_path, !e.init_checkpoint.empty(), dp_rank, dp_size};
}

}  // namespace

Batch TrainPlan::local_part(const Batch& b) const {
  if (grid_rows.second > 1) {   // 2d, 2.5d, 3d: this rank's row block of the batch
    const int64_t rows = b.inputs.size(0) / grid_rows.second;
    auto mine = [&](const at::Tensor& t) { return t.defined() ? t.narrow(0, grid_rows.first * rows, rows) : t; };
    Batch out = b;
    out.inputs = mine(b.inputs);
    out.targets = mine(b.targets);
    out.attention_mask = mine(b.attention_mask);
    out.token_types = mine(b.token_types);
    return out;
  }
  if (!sequence || b.inputs.dim() != 2) return b;   // images: each rank takes its tokens of the patches (ViT)
  Batch out = b;
  out.inputs = sequence->local(b.inputs, 1);     // [B, T / sequence]
  out.targets = sequence->local(b.targets, 1);
  if (b.token_types.defined()) out.token_types = sequence->local(b.token_types, 1);
  // the attention mask stays whole: attention needs every key's, wherever the key is computed
  out.positions = sequence->positions(b.inputs.size(1)).to(b.inputs.device());
  return out;
}

at::Tensor TrainPlan::batch_loss(const at::Tensor& loss) const { return parallel::mean_over_row_blocks(loss, row_groups); }

EffectiveRecipe effective_recipe(const Recipe& r, const TrainOptions& opt) {
  EffectiveRecipe e{r, r.data.tokenizer, "", nullptr, ""};
  // Where the weights start: [model] from (train or finetune), else [finetune] from (finetune only).
  if (!r.model.from.empty() && !r.finetune.from.empty())
    throw RecipeError(r.where("finetune.from"), "and " + r.where("model.from") + " both name a starting point (keep one)");
  const std::string from_key = r.model.from.empty() ? "finetune.from" : "model.from";
  const std::string from = r.model.from.empty() ? r.finetune.from : r.model.from;
  if (opt.finetune && from.empty())
    throw RecipeError(r.where("finetune.from"), "is required by `colossal finetune` (the checkpoint or model directory to start "
                                                "from; [model] from does the same)");
  if (!from.empty()) {
    try {
      e.init_checkpoint = resolve_checkpoint(from);
    } catch (const Error& err) {
      throw RecipeError(r.where(from_key), err.what());
    }
    const auto info = read_checkpoint_info(e.init_checkpoint);
    try {
      refuse_quantized_start(info.config, e.init_checkpoint);
    } catch (const Error& err) {
      throw RecipeError(r.where(from_key), err.what());
    }
    e.recipe.model = finetune_model_config(r, info.model, e.init_checkpoint);
    // The sequence length against the directory's context: its whole context unless the recipe says.
    int64_t& seq_len = e.recipe.train.seq_len;
    const int64_t context = e.recipe.model.block_size;
    if (seq_len == 0 || (seq_len > context && !r.locations.count("train.seq_len"))) seq_len = context;
    if (seq_len > context)
      throw RecipeError(r.where("train.seq_len"), "= " + std::to_string(seq_len) + " exceeds the context of " + e.init_checkpoint +
                                                      " (" + std::to_string(context) + " positions)");
    e.base_config = info.config;
    e.tokenizer_path = e.init_checkpoint;   // the directory: its tokenizer files, whatever their kind
  } else if (!r.sections.count("model")) {
    throw RecipeError(r.path, "has no [model] section (training from scratch needs one; see recipes/gpt-mini.toml)");
  } else {
    check_model_recipe(r);
  }
  if (r.parallel.pipeline > 1) {   // the schedule's micro-batches are the step's accumulation
    if (r.train.grad_accum != 1)
      throw RecipeError(r.where("train.grad_accum"), "= " + std::to_string(r.train.grad_accum) + " with pipeline parallelism: the schedule's "
                        "micro-batches accumulate the step (set [parallel] micro_batches = " + std::to_string(r.train.grad_accum) + " instead)");
    e.recipe.train.grad_accum = pipeline_micro_batches(r.parallel);
  }
  e.task = model_task(e.recipe.model);
  make_task(e.task, task_data(e, 0, 1))->check_data();
  return e;
}

std::unique_ptr<TrainPlan> build_plan(const EffectiveRecipe& effective, const TrainOptions& opt) {
  auto p = std::make_unique<TrainPlan>();
  p->recipe = effective.recipe;
  p->options = opt;
  p->tokenizer_path = effective.tokenizer_path;
  p->base_config = effective.base_config;
  const dist::WorkerEnv env = dist::worker_env(dist::process_env());
  const Recipe& r = p->recipe;
  p->device = resolve_device(r.train.device, r.where("train.device"));
  if (const auto own = device_for_rank(p->device, r.train.device, env.local_rank, env.local_world, r.where("train.device"));
      own != p->device) {
    if (own.is_cpu() && env.local_rank == 0)
      spdlog::info("train.device = \"auto\": {} ranks on this node share {} GPU(s), and each needs its own; training on the CPU",
                   env.local_world, cuda_device_count());
    p->device = own;
  }
  // Refused before anything is allocated, with the dry run's figures: a model the machine or the device
  // budget cannot hold.
  const int64_t params = count_parameters(r.model);
  const int64_t dp = check_parallel_recipe(r, env.world).of(dist::Dim::dp);
  if (p->device.is_cpu()) {
    const int64_t local = env.local_world;   // every worker on this node holds its share
    // a tensor-parallel rank holds about 1/tensor of the parameters
    require_host_memory(estimate_training_memory(r, params / r.parallel.tensor, dp).total() * static_cast<double>(local),
                        "training this " + human_count(static_cast<double>(params)) +
                            "-parameter model (weights, gradients and " + r.optim.name + " state at ZeRO stage " +
                            std::to_string(r.memory.zero) + ", and one micro-batch's activations" +
                            (local > 1 ? ", for each of the " + std::to_string(local) + " workers on this node)" : ")"));
  }
  check_device_budget(r, params, dp);

  // ATen's allocations on this thread on the compute device are counted from here, before the data and
  // the model exist, so whatever they hold is known when a step frees it: `colossal profile`'s tracer
  // reads the count (on a GPU, the GPU's bytes), a device budget on a CPU (the device is host memory
  // there), and on a CPU every step's metrics (tensor_peak_mb: exact, where the resident set carries
  // glibc's free lists).
  if (!opt.profile_out.empty() || p->device.is_cpu())
    p->counter = std::make_shared<memory::AllocationCounter>(p->device);
  if (!opt.profile_out.empty()) p->tracer = std::make_shared<memory::MemoryTracer>(p->counter);
  p->runtime = join_job(r, opt, env, p->device);                       // 1. the job and its mesh
  p->dp_rank = p->runtime->mesh().coordinate(p->runtime->rank(), dist::Dim::dp);
  p->dp_size = p->runtime->mesh().shape().of(dist::Dim::dp);
  if (p->is_root()) {
    create_output_dir(r.output.dir, r.where("output.dir"));
    set_log_file((fs::path(r.output.dir) / "train.log").string());
    spdlog::info("colossal {} {} -> {}", opt.finetune ? "finetune" : "train", r.path, r.output.dir);
  }
  p->task = make_task(effective.task, task_data(effective, p->dp_rank, p->dp_size));
  load_data(*p);                                                  // 2. data
  const std::string resume_from = opt.resume ? resume_checkpoint(*p) : "";
  p->rss_before_model = current_rss_bytes();
  build_model_shapes(*p);                                         // 3. model (shapes only)
  // A count's sum over the step's parts: the replicas', and the row blocks' of a 2D or 3D layout.
  std::vector<dist::Group*> parts{&p->runtime->replicas()};
  parts.insert(parts.end(), p->row_groups.begin(), p->row_groups.end());
  p->task->set_global_count(
      [parts](double local) {
        at::Tensor t = at::tensor({local}, at::kDouble);
        for (dist::Group* g : parts) g->all_reduce(t, dist::Reduce::sum, "loss count");
        return t.item<double>();
      },
      static_cast<double>(p->runtime->replicas().size() * p->grid_rows.second));
  apply_memory(*p);                                               // 4. memory layout, data parallelism, optimizer
  fill_parameters(*p, opt.resume ? resume_from : effective.init_checkpoint, opt.resume);   // 5. weights
  p->peak_rss_after_setup = peak_rss_bytes();
  if (r.memory.activation_checkpoint == "auto") {                 // the blocks' costs measured, the cheapest fit chosen
    p->recompute_plan = choose_recompute(r, measure_block_activations(*p), "measured");
    p->hooks->set_recompute(p->recompute_plan->recompute);
    spdlog::info("activation checkpointing auto: {}", describe_recompute(r, *p->recompute_plan));
  }
  if (opt.resume) resume(*p, resume_from);                        // 6. state
  // Each pipeline stage's dropout from a stream of its own (the default generator otherwise draws the
  // same masks on every stage); after a resume, which restores rank 0's state everywhere.
  if (const int64_t stage = p->runtime->group(dist::Dim::pp).rank(); stage > 0)
    at::manual_seed(static_cast<uint64_t>(r.train.seed) + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(stage) +
                    static_cast<uint64_t>(p->state.step));
  if (p->is_root()) create_output_dir(r.checkpoint.dir, r.where("checkpoint.dir"));   // now, not at the first save
  return p;
}

}  // namespace colossal
