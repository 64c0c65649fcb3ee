// LayerFactory: the one place models get their parameterised layers from. A model asks for a
// column-split or row-split linear, a vocabulary-split embedding, an attention of H heads or an MLP;
// the factory decides how they are laid out. The plain factory here builds unsplit layers; the
// tensor-parallel factories (1D/2D/2.5D/3D) return split implementations of the same interfaces,
// so models never branch on a parallel mode.
#pragma once
#include <ATen/core/Tensor.h>
#include <functional>
#include <memory>
#include <optional>

#include "kernels/cpu/decode_block.h"
#include "src/nn/module.h"

namespace colossal::nn {

// How a layer's weight would be divided across a tensor-parallel group (Megatron's terms).
enum class Split {
  Replicated,
  Column,   // output features split: y_i = x W_i (no communication in forward)
  Row,      // input features split: y = sum_i x_i W_i (all-reduce in forward)
  Vocab,    // embedding rows split by vocabulary range
  Head,     // a model's output layer (a classifier): the input as the layout holds the residual stream,
            // the outputs whole (layouts that cut the stream's features sum the partial products)
};

struct LinearSpec {
  int64_t in = 0, out = 0;
  bool bias = true;
  Split split = Split::Replicated;
  // The output features are `parts` equal segments (attention's fused q, k, v: 3); a column split cuts
  // each segment, so a rank's heads stay whole.
  int64_t parts = 1;
};

// y = x W^T + b, with W stored [out, in] (torch's layout; HF Conv1D layouts are transposed at IO).
class Linear : public Module {
 public:
  virtual at::Tensor forward(const at::Tensor& x) = 0;   // [..., in] -> [..., out]
  virtual at::Tensor& weight() = 0;
  // This layer's product for a decoding step of `rows` sequences (x [rows, 1, in], CPU float, no
  // gradient mode) as kernels/cpu/decode_block.h runs it, where forward(x) would run that same decoding
  // kernel (already chosen at this shape); none elsewhere (the step then goes op by op).
  virtual std::optional<kernels::DecodeProduct> decode_product(int64_t /*rows*/) { return std::nullopt; }
  // forward(gelu_tanh(h)): an MLP's projection of its hidden layer. A layer may save h alone for its
  // backward and compute the GELU again there (DenseLinear's training path on CPU: linear_forward.h).
  virtual at::Tensor forward_after_gelu_tanh(const at::Tensor& h);
};

class Embedding : public Module {
 public:
  virtual at::Tensor forward(const at::Tensor& ids) = 0;   // [...] -> [..., dim]
  virtual at::Tensor& weight() = 0;                         // [num, dim] (a quantized one's integers)
  // x [..., dim] -> x W^T [..., num]: the tied LM head's logits (all of them, whatever the split).
  virtual at::Tensor project(const at::Tensor& x);
  // x [N, dim], targets [N] (negative: ignored) -> the mean cross entropy of the tied head's logits,
  // without storing log-probabilities (lm_head_loss.h); a vocabulary-split table never gathers them.
  virtual at::Tensor head_cross_entropy(const at::Tensor& x, const at::Tensor& targets);
  // The dtype its rows come out in (and activations and KV caches follow).
  virtual c10::ScalarType output_dtype() { return weight().scalar_type(); }
};

enum class Act { GeluTanh, Gelu, Relu };

struct AttentionSpec {
  int64_t width = 0, heads = 0;
  bool causal = true;
  bool bias = true;
  double dropout = 0.0;        // on the output projection (and the probabilities unless attn_dropout)
  double attn_dropout = -1;    // on the attention probabilities; -1 = dropout
  bool alibi = false;          // ALiBi distance bias instead of position embeddings (BLOOM)
};

struct MlpSpec {
  int64_t width = 0, hidden = 0;
  Act act = Act::GeluTanh;
  bool bias = true;
  double dropout = 0.0;
};

// The attention heads this rank computes: [first, first + count) of the layer's heads.
struct HeadRange {
  int64_t first = 0, count = 0;
};

// How a layout holds the residual stream [rows, (tokens,) features]: for the parameters a model adds
// to the stream itself (ViT's class token, position table and patch projection; BERT's MLM bias), 2D
// and 3D cut the features and hold such a parameter whole along the ranks that split the batch,
// summing its gradient over them; every other layout holds each feature on every rank and uses the
// parameter as it is. And for dropout on the stream (the "shared stream" of Megatron's tracker): every
// layout draws the mask of the whole batch from the default generator and keeps the piece it holds
// (rows and features under 2D and 3D, tokens under sequence parallelism), so masks and the generator's
// state equal one process's whatever the layout.
class StreamCut {
 public:
  virtual ~StreamCut() = default;
  virtual int64_t pieces() const { return 1; }   // the stream's features are cut into this many
  // The cut of a parameter whose dimension `dim` runs over the stream's features (-1: none of them do).
  virtual ShardSpec shard(int64_t /*dim*/) const { return {}; }
  // The parameter's value as forward uses it.
  virtual at::Tensor use(const at::Tensor& p) const { return p; }
  // x (this rank's piece of the stream) with dropout p in training (at::dropout's draws, whole).
  virtual at::Tensor dropout(const at::Tensor& x, double p) const;
  // The stream as the blocks hold it, from and back to the stream as the layers around them hold it
  // (Megatron-style sequence parallelism: each tensor-parallel rank's tokens inside the blocks).
  virtual at::Tensor enter_blocks(const at::Tensor& x) const { return x; }
  virtual at::Tensor leave_blocks(const at::Tensor& x) const { return x; }
  // A sequence split across ranks (nn::SequenceAttention's): how many equal chunks, this rank's tokens
  // of a whole sequence, and the first token on every rank. Unsplit: 1, x, x[:, 0].
  virtual int64_t token_chunks() const { return 1; }
  virtual at::Tensor local_tokens(const at::Tensor& x) const { return x; }
  virtual at::Tensor first_token(const at::Tensor& x) const;
};

// at::dropout's noise for a tensor of `whole` sizes: Bernoulli(1 - p) / (1 - p) from the default
// generator, drawn exactly as ATen draws it, so a piece of it is that piece of one process's mask.
at::Tensor dropout_noise(at::IntArrayRef whole, double p, const at::TensorOptions& options);

class Attention;
class Mlp;
class RandomStream;
class SequenceAttention;
class LayerNorm;

// Where a model's parameters get their memory. `allocated`: at construction (the values then come from
// the model's init rules, which build_model applies, or from a load). `deferred`: shapes only, tensors
// with no storage, for a training run whose chunk store provides every parameter's memory and streams
// the initial or loaded values into it one tensor at a time (under ZeRO-3 no rank ever holds the whole
// model). A deferred parameter must not be read before the store has taken it.
enum class ParamStorage { allocated, deferred };

// A tensor of `shape` whose storage holds nothing yet (what deferred parameters are made of).
at::Tensor unallocated_tensor(at::IntArrayRef shape, at::ScalarType dtype = at::kFloat);
// Whether `t` has elements but no memory behind them (a deferred parameter, or a released ZeRO-3 chunk).
bool is_unallocated(const at::Tensor& t);

class LayerFactory {
 public:
  explicit LayerFactory(ParamStorage storage = ParamStorage::allocated) : storage_(storage) {}
  virtual ~LayerFactory() = default;
  ParamStorage storage() const { return storage_; }
  // A new parameter tensor of `shape` (fp32, CPU): uninitialised memory, or none when deferred.
  at::Tensor parameter(at::IntArrayRef shape) const;

  virtual std::shared_ptr<Linear> linear(const LinearSpec& spec);
  virtual std::shared_ptr<Embedding> embedding(int64_t num, int64_t dim, Split split = Split::Replicated);
  virtual std::shared_ptr<LayerNorm> layer_norm(int64_t dim, double eps);
  virtual std::shared_ptr<Attention> attention(const AttentionSpec& spec);
  virtual std::shared_ptr<Mlp> mlp(const MlpSpec& spec);
  // Which of `heads` heads a split attention computes here (all of them unless tensor-parallel).
  virtual HeadRange local_heads(int64_t heads) const { return {0, heads}; }
  // How this layout holds the residual stream where the layer being built sits (inside the blocks or
  // around them).
  virtual std::shared_ptr<const StreamCut> stream_cut() const;
  // Whether the layers being built are a transformer block's (add_blocks says): a layout may hold the
  // stream differently inside the blocks (Megatron-style sequence parallelism splits its tokens there).
  bool in_blocks() const { return in_blocks_; }
  void set_in_blocks(bool on) { in_blocks_ = on; }
  // The padding mask of the rows a split attention computes, from the mask of the rows its block's
  // input holds (empty: the same rows; 3D's dense layers move the rows between axes).
  virtual std::function<at::Tensor(const at::Tensor&)> attention_rows() const { return {}; }
  // The random stream dropout inside a tensor-parallel region draws from (random_stream.h); null: the
  // default generator, as everywhere when nothing is split.
  virtual std::shared_ptr<RandomStream> region_random() { return nullptr; }
  // Attention over a sequence split across ranks (null: each rank holds whole sequences). Any factory
  // may carry one, so tensor and sequence parallelism combine.
  std::shared_ptr<SequenceAttention> sequence_attention() const { return sequence_attention_; }
  void set_sequence_attention(std::shared_ptr<SequenceAttention> s) { sequence_attention_ = std::move(s); }

 private:
  ParamStorage storage_;
  bool in_blocks_ = false;
  std::shared_ptr<SequenceAttention> sequence_attention_;
};

}  // namespace colossal::nn
