// Recipe: the typed, validated form of a recipe TOML file. Each section has its own config struct
// with defaults; load_recipe() parses and validates all of them and reports the first problem as a
// RecipeError naming file, line and key. Nothing outside src/core reads raw TOML.
#pragma once
#include <array>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace colossal {

struct ModelConfig {                 // [model]
  std::string from;                  // a model directory (save_pretrained's layout, or a checkpoint of
                                     // ours): family, sizes, weights and tokenizer come from it
  std::string family = "gpt";        // a family registered in models/registry.cpp (gpt, opt)
  int64_t n_layer = 12;
  int64_t n_head = 12;
  int64_t n_embd = 768;
  int64_t block_size = 1024;         // context length (learned positions)
  int64_t vocab_size = 50304;        // may exceed the tokenizer's vocabulary (padding for fast matmuls)
  double dropout = 0.0;              // embeddings, attention probabilities, residual branches
  double attn_dropout = -1;          // attention probabilities alone; -1 = dropout
  // The attention probabilities' rate: attn_dropout, or dropout where it is -1.
  double attention_dropout() const { return attn_dropout < 0 ? dropout : attn_dropout; }
  bool bias = true;
  double layer_norm_eps = 1e-5;
  double init_std = 0.02;
  int64_t n_inner = 0;               // MLP hidden width; 0 = 4 * n_embd
  std::string activation = "auto";   // auto (the family's own) | gelu_tanh | gelu | relu
  bool pre_norm = true;              // LayerNorm before each sublayer (false: after the residual add)
  int64_t embed_dim = 0;             // token-embedding width when narrower than n_embd (projected in
                                     // and out, as OPT-350m's word_embed_proj_dim); 0 = n_embd
  std::string head = "auto";         // auto (the family's own) | mlm | classifier (encoder families)
  int64_t num_labels = 2;            // classes of a classifier head
  int64_t type_vocab_size = 2;       // segment (token type) embeddings of encoder families
  int64_t image_size = 224;          // vision families: square input images of this side
  int64_t patch_size = 16;           //   cut into patches of this side
  int64_t channels = 3;              //   with this many channels
};

struct DataConfig {                  // [data]
  std::string text;                  // source text (documents separated by blank lines); used to build
                                     // the tokenizer and dataset when they do not exist yet
  std::string tokenizer;             // SentencePiece model, or a directory with HF tokenizer files
                                     // (unused with [model] from, which brings its own)
  std::string dataset;               // tokenized HDF5 dataset path
  int64_t tokenizer_vocab = 0;       // vocabulary to train the tokenizer with; 0 = model.vocab_size
  double val_fraction = 0.02;        // documents held out for eval loss
  int64_t prefetch = 4;              // batches prepared ahead on the loader thread
};

struct TrainConfig {                 // [train]
  int64_t batch_size = 8;            // sequences per micro-batch
  int64_t grad_accum = 1;            // micro-batches per optimizer step
  int64_t seq_len = 0;               // 0 = model.block_size
  int64_t max_steps = 1000;
  double time_limit_min = 0;         // stop (and save) after this many minutes; 0 = no limit
  int64_t eval_every = 200;          // 0 = only at the end
  int64_t eval_batches = 20;
  int64_t log_every = 10;
  int64_t seed = 1337;
  std::string device = "auto";       // auto | cpu | cuda
  double grad_clip = 1.0;            // max global gradient norm; 0 = off
};

struct OptimConfig {                 // [optim]
  std::string name = "adamw";        // adamw | lamb | lars | lion | sgd
  double lr = 6e-4;
  double min_lr = 6e-5;
  double weight_decay = 0.1;         // applied to matrices and embeddings, not to biases and norms
  std::array<double, 2> betas{0.9, 0.95};   // adamw, lamb, lion
  double eps = 1e-8;                 // adamw, lamb, lars (the trust ratio's denominator)
  double momentum = 0.9;             // sgd, lars
  bool nesterov = false;             // sgd
  double trust_coefficient = 0.001;  // lars: eta of the local learning rate
  int64_t warmup_steps = 100;
  std::string schedule = "cosine";   // cosine | linear | constant (after warmup)
  int64_t decay_steps = 0;           // steps over which lr decays to min_lr; 0 = train.max_steps
};

struct CheckpointConfig {            // [checkpoint]
  std::string dir;                   // "" = <output.dir>/checkpoints
  int64_t every = 500;               // steps between checkpoints; 0 = only at the end
  int64_t keep_last = 3;
  bool at_end = true;                // false: no checkpoint when the run ends (a model whose checkpoint the
                                     // disk cannot hold beside its NVMe offload file)
};

struct FinetuneConfig {              // [finetune]
  std::string from;                  // checkpoint or model directory to start from (as [model] from)
};

struct KernelsConfig {               // [kernels]: our CPU kernel or ATen's, for those that have both
  std::string attention = "auto";    // auto (time both at first use, keep the faster) | fused | aten
  std::string gelu = "auto";         // the same choices
  std::string gemv = "auto";         // decoding matrix-vector products (generation, eval-free)
  std::string layer_norm = "auto";   // LayerNorm forward and backward
  std::string gemm = "auto";         // the dense layers' products while training (forward, dx, dW)
};

struct ParallelConfig {             // [parallel]: how the world's ranks are arranged (src/dist/mesh.h)
  int64_t data = 0;                  // data-parallel size; 0 = "auto" (the world divided by the others)
  int64_t tensor = 1;                // tensor-parallel size
  std::string tensor_mode = "1d";    // 1d (Megatron's column/row split) | 2d | 2.5d | 3d
  int64_t tensor_depth = 1;          // 2.5d's depth d (tensor = q * q * d)
  int64_t pipeline = 1;              // pipeline stages
  std::string schedule = "1f1b";     // gpipe | 1f1b | interleaved | zero_bubble (src/parallel/pipeline_schedule.h)
  int64_t virtual_stages = 1;        // interleaved: chunks of blocks each pipeline rank holds (v)
  int64_t micro_batches = 0;         // micro-batches a step, each of train.batch_size samples; 0 = "auto" (2 x pipeline)
  std::string partition = "uniform"; // uniform | parameters | profile (measured time): how blocks are cut into stages
  int64_t sequence = 1;              // sequence-parallel size
  std::string sequence_mode = "split_gather";   // split_gather | ring | all_to_all
  bool tensor_sequence = false;      // Megatron-style: 1d tensor ranks split the blocks' tokens between layers
  double timeout_s = 300;            // a collective or the rendezvous waiting longer ends the job
  std::string backend = "auto";      // auto (gloo on CPU, nccl for CUDA tensors) | gloo | nccl
};

struct MemoryConfig {               // [memory]: where parameters, gradients and optimizer states live
  int64_t zero = 0;                  // ZeRO stage: 0 (plain data parallelism), 1 (optimizer states
                                     // sharded), 2 (and gradients), 3 (and parameters)
  double chunk_size_mb = 0;          // fp32 MiB per chunk; 0 = "auto" (searched to minimise padding)
  std::string offload_optimizer = "none";   // none | cpu | nvme: optimizer states (with gradient shards and
                                            // master weights) in host memory, updated there by the host optimizer,
                                            // or in a file under nvme_path streamed through host memory at each step
  std::string offload_params = "none";      // none | cpu | nvme (ZeRO-3): the blocks' parameter shards in host
                                            // memory, or in that file (ZeRO-Infinity's parameter offload), brought
                                            // to the device as each block runs
  std::string nvme_path;             // a directory on a local disk (required by nvme offload)
  std::string placement = "auto";    // device | cpu | auto (ZeRO-3): where chunks live by default; auto measures
                                     // the first step and fills a device budget (see Gemini placement)
  double device_memory_limit_gb = 0; // ZeRO-3: the most the compute device may hold (0: no budget; a GPU under
                                     // auto: 90% of its memory)
  double host_memory_limit_gb = 0;   // the most the chunks may keep in host memory (0: no limit)
  std::string overlap_update = "auto";   // auto | on | off (ZeRO-3): each step's update runs beside the next
                                         // forward, chunk by chunk in the order it reads them; auto: where the
                                         // two wait on different things (states on NVMe; on a GPU, in host memory)
  std::string activation_checkpoint = "none";   // none | full | every_n | auto: blocks whose activations backward
                                                // recomputes instead of keeping (every_n: blocks 0, n, 2n, ...;
                                                // auto: the cheapest choice within activation_memory_gb)
  int64_t checkpoint_every = 2;      // every_n's n
  double activation_memory_gb = 0;   // auto: the most one micro-batch's block activations may hold (GiB)
  double device_limit_bytes() const { return device_memory_limit_gb * 1073741824.0; }
  double host_limit_bytes() const { return host_memory_limit_gb * 1073741824.0; }
};

struct PrecisionConfig {            // [precision]
  std::string dtype = "fp32";        // fp32 | bf16 | fp16: what the model computes in; fp32 master weights
                                     // and optimizer states stay in the chunks
  double initial_scale = 65536;      // fp16's dynamic loss scale: where it starts,
  double growth_factor = 2;          //   what it is multiplied by after growth_interval clean steps,
  double backoff_factor = 0.5;       //   and after a step whose gradients overflowed (that step is skipped)
  int64_t growth_interval = 2000;
};

struct OutputConfig {                // [output]
  std::string dir;                   // "" = runs/<name>
  std::string log_level = "info";    // trace | debug | info | warn | error
};

struct Recipe {
  std::string path;                  // the file it came from
  std::string name;                  // run name
  ModelConfig model;
  DataConfig data;
  TrainConfig train;
  OptimConfig optim;
  CheckpointConfig checkpoint;
  FinetuneConfig finetune;
  KernelsConfig kernels;
  ParallelConfig parallel;
  MemoryConfig memory;
  PrecisionConfig precision;
  OutputConfig output;
  std::set<std::string> sections;                 // the [sections] the recipe (or a --set) wrote
  std::map<std::string, std::string> locations;   // "train.lr" -> "recipes/x.toml:12" or "--set train.lr"

  // Where a key was set, for errors raised after parsing (e.g. by the model registry).
  std::string where(const std::string& dotted_key) const;
  // The resolved recipe as TOML (every key, defaults included): for --dry-run and checkpoints.
  std::string to_toml() const;
};

// Parses `path`, applies `overrides` ("section.key=value", value in TOML syntax or a bare string) and
// validates. Throws RecipeError.
Recipe load_recipe(const std::string& path, const std::vector<std::string>& overrides = {});
// The same from TOML text (tests, and recipes embedded in checkpoints).
Recipe parse_recipe(const std::string& toml_text, const std::string& path,
                    const std::vector<std::string>& overrides = {});

}  // namespace colossal
