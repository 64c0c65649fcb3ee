// Plain (unsplit) layers and the default factory: see factory.h.
#include "src/nn/factory.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "src/nn/activation.h"
#include "src/nn/attention.h"
#include "src/nn/embedding_lookup.h"
#include "src/nn/kernel_choice.h"
#include "src/nn/layer_norm.h"
#include "src/nn/linear_forward.h"
#include "src/nn/lm_head_loss.h"
#include "src/nn/mlp.h"
#include "src/nn/sequence_attention.h"

namespace colossal::nn {
namespace {

class DenseLinear : public Linear {
 public:
  DenseLinear(const LinearSpec& s, const LayerFactory& f) {
    weight_ = register_parameter("weight", f.parameter({s.out, s.in}));
    if (s.bias) bias_ = register_parameter("bias", f.parameter({s.out}));
  }
  at::Tensor forward(const at::Tensor& x) override { return linear_forward(x, weight_, bias_); }
  at::Tensor forward_after_gelu_tanh(const at::Tensor& h) override { return linear_forward_after_gelu_tanh(h, weight_, bias_); }
  at::Tensor& weight() override { return weight_; }
  std::optional<kernels::DecodeProduct> decode_product(int64_t rows) override {
    if (at::GradMode::is_enabled() || rows < 1 || rows > kGemvMaxRows || !gemv_takes(weight_, bias_) ||
        !gemv_choice_.get(weight_.is_contiguous(), [&] { return gemv_decision(weight_, bias_); }))
      return std::nullopt;
    kernels::DecodeProduct p;
    p.kind = weight_.is_contiguous() ? kernels::DecodeProduct::Kind::f32 : kernels::DecodeProduct::Kind::f32_t;
    p.w = weight_.const_data_ptr<float>();
    p.bias = bias_.defined() ? bias_.const_data_ptr<float>() : nullptr;
    p.in = weight_.size(1);
    p.out = weight_.size(0);
    return p;
  }

 private:
  at::Tensor weight_, bias_;
  ChoiceMemo gemv_choice_;   // keyed by the layout (W or W^T), which names the shape
};

class DenseEmbedding : public Embedding {
 public:
  DenseEmbedding(int64_t num, int64_t dim, const LayerFactory& f) { weight_ = register_parameter("weight", f.parameter({num, dim})); }
  at::Tensor forward(const at::Tensor& ids) override { return embedding_lookup(weight_, ids); }
  at::Tensor& weight() override { return weight_; }

 private:
  at::Tensor weight_;
};

}  // namespace

at::Tensor Linear::forward_after_gelu_tanh(const at::Tensor& h) { return forward(gelu_tanh(h)); }

at::Tensor StreamCut::dropout(const at::Tensor& x, double p) const { return at::dropout(x, p, true); }

at::Tensor StreamCut::first_token(const at::Tensor& x) const { return x.select(1, 0); }

at::Tensor dropout_noise(at::IntArrayRef whole, double p, const at::TensorOptions& options) {
  return at::empty(whole, options).bernoulli_(1 - p).div_(1 - p);   // ATen's _dropout, CPU and GPU alike
}

namespace {

// A sequence split across ranks: each rank's tokens of the whole sequence's masks.
class SequenceStreamCut : public StreamCut {
 public:
  explicit SequenceStreamCut(std::shared_ptr<SequenceAttention> s) : sequence_(std::move(s)) {}
  at::Tensor dropout(const at::Tensor& x, double p) const override { return sequence_->dropout(x, p); }
  int64_t token_chunks() const override { return sequence_->chunks(); }
  at::Tensor local_tokens(const at::Tensor& x) const override { return sequence_->local_tokens(x); }
  at::Tensor first_token(const at::Tensor& x) const override { return sequence_->first_token(x); }

 private:
  std::shared_ptr<SequenceAttention> sequence_;
};

}  // namespace

std::shared_ptr<const StreamCut> LayerFactory::stream_cut() const {
  static const auto whole = std::make_shared<const StreamCut>();
  if (sequence_attention_) return std::make_shared<SequenceStreamCut>(sequence_attention_);
  return whole;
}

at::Tensor Embedding::project(const at::Tensor& x) { return linear_forward(x, weight()); }

at::Tensor Embedding::head_cross_entropy(const at::Tensor& x, const at::Tensor& targets) {
  return lm_head_cross_entropy(x, weight(), targets);
}

at::Tensor unallocated_tensor(at::IntArrayRef shape, at::ScalarType dtype) {
  at::Tensor t = at::empty({0}, dtype);
  t.unsafeGetTensorImpl()->set_sizes_contiguous(shape);   // sizes only: the storage stays empty
  return t;
}

bool is_unallocated(const at::Tensor& t) { return t.numel() > 0 && t.storage().nbytes() == 0; }

at::Tensor LayerFactory::parameter(at::IntArrayRef shape) const {
  return storage_ == ParamStorage::deferred ? unallocated_tensor(shape) : at::empty(shape);
}

std::shared_ptr<Linear> LayerFactory::linear(const LinearSpec& spec) { return std::make_shared<DenseLinear>(spec, *this); }

std::shared_ptr<Embedding> LayerFactory::embedding(int64_t num, int64_t dim, Split) {
  return std::make_shared<DenseEmbedding>(num, dim, *this);
}

std::shared_ptr<LayerNorm> LayerFactory::layer_norm(int64_t dim, double eps) {
  return std::make_shared<LayerNorm>(dim, eps, *this);
}

std::shared_ptr<Attention> LayerFactory::attention(const AttentionSpec& spec) {
  return std::make_shared<Attention>(spec, *this);
}

std::shared_ptr<Mlp> LayerFactory::mlp(const MlpSpec& spec) { return std::make_shared<Mlp>(spec, *this); }

}  // namespace colossal::nn
