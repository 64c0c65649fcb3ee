// Checkpoints: one directory per save, written under a temporary name and renamed (AtomicDir), then
// pointed to by `latest` (itself replaced atomically), with keep-last-N rotation.
//
//   step-000400/model.safetensors      weights under Hugging Face names and layouts (loadable by
//                                      transformers with config.json)
//   step-000400/config.json            the model's HF config
//   step-000400/tokenizer.model        the tokenizer's files as it was read (a SentencePiece model,
//                                      or tokenizer.json, tokenizer_config.json, vocab.txt, ...)
//   step-000400/optimizer.safetensors  optimizer states under the same names + "exp_avg" etc, and the
//                                      RNG state
//
// Under ZeRO 1-3 at more than one rank, every rank writes the tensors it owns (chunk_store.h: the rank
// whose shard holds a tensor's first element) into model-0000r-of-0000N.safetensors and
// optimizer-0000r-of-0000N.safetensors, and rank 0 writes transformers' sharded index
// (model.safetensors.index.json, and the same for the optimizer) naming each tensor's file. No rank
// gathers the model; `latest` moves once every rank's files are on disk.
//   step-000400/trainer_state.json     step, data-loader position, tokens seen, losses
//   step-000400/recipe.toml            the resolved recipe
#pragma once
#include <ATen/core/Tensor.h>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <map>
#include <string>
#include <vector>

#include "src/core/recipe.h"
#include "src/data/hf_tokenizer_files.h"
#include "src/io/hf_weights.h"
#include "src/io/safetensors.h"
#include "src/nn/factory.h"
#include "src/nn/model.h"
#include "src/dist/group.h"
#include "src/memory/train_strategy.h"

namespace colossal {

struct TrainerState {
  int64_t step = 0;              // optimizer steps completed
  int64_t samples_seen = 0;      // global training samples consumed (all ranks), the data position
  int64_t legacy_batches = -1;   // checkpoints before data parallelism counted batches of one process
  int64_t world_size = 1;        // ranks that wrote it (resume may use another data-parallel size)
  int64_t tokens_seen = 0;
  double train_loss = 0.0;
  double eval_loss = -1.0;       // -1: not evaluated yet
  double eval_accuracy = -1.0;   // -1: not evaluated yet, or a task without an accuracy
  // CPU kernel choices timed so far ("attention B=16 T=128 H=4 D=32 fwd+bwd" -> "fused" | "aten"), so
  // a resumed run computes with the same kernels and stays identical to an uninterrupted one.
  std::map<std::string, std::string> kernel_choices;
};

struct CheckpointSave {
  nn::Model* model = nullptr;
  memory::TrainStrategy* strategy = nullptr;   // its parameters and optimizer states (null: the model's weights only)
  dist::Group* group = nullptr;                // the ranks that save together (null: this process alone)
  TokenizerFiles tokenizer_files;   // written unchanged, so transformers reads the same tokenizer
  std::string recipe_toml;
  TrainerState state;
  // config.json of the model the run started from: its fields our config does not write (and its
  // token ids) are kept, so a finetuned Hugging Face model saves with the config it came with.
  nlohmann::json base_config;
  dist::Group* tensor_group = nullptr;   // tensor parallelism: the ranks holding the other pieces of split tensors
  // Pipeline parallelism: the ranks holding the other stages (each stage writes its own files, and the
  // index names them all), which parameters this rank holds (null: all) and the copies it does not
  // write (the last stage's copy of a tied embedding, which the first stage writes).
  dist::Group* pipeline_group = nullptr;
  std::function<bool(const std::string&)> holds;
  std::vector<std::string> copies;
};

// Writes <dir>/step-NNNNNN atomically, updates <dir>/latest, deletes the oldest beyond keep_last.
// Returns the new checkpoint's path. With a group, every rank of it calls this together.
std::string save_checkpoint(const std::string& dir, const CheckpointSave& save, int64_t keep_last);

// Accepts a checkpoint or Hugging Face model directory (config.json and weights in any format
// HfWeights reads), a checkpoints directory with `latest`, or a run directory with
// checkpoints/latest. Error naming the path and what was expected otherwise.
std::string resolve_checkpoint(const std::string& path);

struct CheckpointInfo {
  std::string dir;
  nlohmann::json config;         // config.json
  ModelConfig model;             // decoded from config.json
  TokenizerFiles tokenizer_files;   // the directory's tokenizer files (Tokenizer::from_files reads them; empty: none)
  TrainerState state;
  bool has_state = false;        // trainer_state.json was there (resume requires it)
};
CheckpointInfo read_checkpoint_info(const std::string& dir);

// One of our tensors as the HF tensors that store it: split into parts, transposed or interleaved
// per head as the name map's target says, each named with `suffix` appended.
std::vector<NamedTensor> hf_pieces(const nn::HfTarget& target, const at::Tensor& t, const std::string& suffix = "");
// The entries (names, type, shapes) those pieces have in a safetensors header, from the shape alone (a
// writer's header planned before any value exists).
std::vector<SafetensorsWriter::Entry> hf_entries(const nn::HfTarget& target, at::IntArrayRef shape, at::ScalarType dtype,
                                                 const std::string& suffix = "");
// Model weights <-> HF-named tensors (transposing where the family's name map says so).
std::vector<NamedTensor> export_model_state(nn::Model& model);
// Every parameter must be there with its shape (any floating dtype: fp16 and bf16 checkpoints are
// converted); a tensor that is neither ours nor one HF saves redundantly is an error.
void load_model_state(nn::Model& model, const HfWeights& weights);
// The same reading, one parameter at a time in the model's order: each value (our layout, fp32, on
// the CPU) is handed to `take` and dropped after, so a model whose parameters
// are deferred (the chunk store's) loads without any process holding the whole checkpoint. `only`:
// the parameters to read (all when empty); the files are checked against the whole model either way.
// `views`: a parameter stored as one tensor comes as what was read, viewed in our layout (transposed,
// in the file's precision, read-only where the reads are mapped), not copied into an fp32 tensor of our
// layout: for a taker that converts it at once anyway (the quantizer: the copy was a quarter of its time).
void read_model_state(const nn::Model& model, const HfWeights& weights,
                      const std::function<void(const std::string& name, const at::Tensor& value)>& take,
                      const std::function<bool(const std::string& name)>& only = {}, bool views = false);
// A parameter whose stored tensor is already our tensor, byte for byte, or its transpose (GPT-2's Conv1D
// weights): one tensor of the parameter's own type (fp32, or a quantized layer's integers) in a
// safetensors file, not parts of it, not heads interleaved, not a tensor-parallel piece. A reader can
// then view the file's bytes in place (StreamedWeights reads blocks straight from the checkpoint so).
struct StoredAsIs {
  std::string file;
  uint64_t offset = 0, bytes = 0;      // from the file's start
  std::vector<int64_t> stored_shape;   // as the file holds it
  bool transpose = false;              // ours is the stored tensor transposed
};
// Every parameter of `model` stored that way, by name; the others are absent. The files are checked
// against the model as read_model_state checks them.
std::map<std::string, StoredAsIs> parameters_stored_as_is(const nn::Model& model, const HfWeights& weights);
// A model directory as transformers' save_pretrained writes it (our checkpoints are such directories):
// the family and sizes from config.json, the weights in any format HfWeights reads.
// Error when `config` (a directory's config.json) describes quantized weights: training starts from fp32.
void refuse_quantized_start(const nlohmann::json& config, const std::string& dir);
std::shared_ptr<nn::Model> load_pretrained(const std::string& dir, nn::LayerFactory& factory);

// A model directory as save_pretrained writes one (model.safetensors, config.json, the tokenizer's files),
// built beside `dir` and renamed into place (an existing directory is replaced whole). config.json is
// the model's over `base_config` (as a checkpoint's), with `extra_config`'s keys set on top. Returns `dir`.
std::string save_model_dir(const std::string& dir, nn::Model& model, const TokenizerFiles& tokenizer_files,
                           const nlohmann::json& base_config, const nlohmann::json& extra_config = nlohmann::json::object());

// The same directory written one tensor at a time, for a model never whole in memory: `entries` (HF
// names, types and shapes, in file order) declare the files, and `produce` hands each tensor to `write`
// in that order (an Error for one out of order). The files are cut as save_pretrained cuts them, at most
// max_shard_bytes each (ShardedSafetensorsWriter); `model` gives config.json (shapes only: its
// parameters may be deferred). `files_written`, when given, is set to the number of safetensors files.
using TensorSink = std::function<void(const std::string& name, const at::Tensor& t)>;
std::string save_model_dir_streamed(const std::string& dir, nn::Model& model, std::vector<SafetensorsWriter::Entry> entries,
                                    const std::function<void(const TensorSink& write)>& produce, uint64_t max_shard_bytes,
                                    const TokenizerFiles& tokenizer_files, const nlohmann::json& base_config,
                                    const nlohmann::json& extra_config = nlohmann::json::object(), int64_t* files_written = nullptr);

// Restores optimizer states (each rank its own part, read one tensor at a time), the step count and
// the RNG state saved with them, from a checkpoint written at any ZeRO stage and data-parallel size.
void load_optimizer_state(nn::Model& model, memory::TrainStrategy& strategy, const std::string& dir);

// Fills `whole` (one of our tensors) from the HF tensors `target` names, each with `suffix`; Error
// naming the file and tensor when one is missing or has another shape.
void read_hf_pieces(const nn::HfTarget& target, const std::string& suffix, const HfWeights& weights, at::Tensor whole);

}  // namespace colossal
