// Plain (unsplit) layers and the default factory: see factory.h.
#include "src/nn/factory.h"

#include <ATen/ATen.h>

#include "src/nn/attention.h"
#include "src/nn/layer_norm.h"
#include "src/nn/linear_forward.h"
#include "src/nn/mlp.h"

namespace colossal::nn {
namespace {

class DenseLinear : public Linear {
 public:
  explicit DenseLinear(const LinearSpec& s) {
    weight_ = register_parameter("weight", at::empty({s.out, s.in}));
    if (s.bias) bias_ = register_parameter("bias", at::zeros({s.out}));
  }
  at::Tensor forward(const at::Tensor& x) override { return linear_forward(x, weight_, bias_); }
  at::Tensor& weight() override { return weight_; }

 private:
  at::Tensor weight_, bias_;
};

class DenseEmbedding : public Embedding {
 public:
  DenseEmbedding(int64_t num, int64_t dim) { weight_ = register_parameter("weight", at::empty({num, dim})); }
  at::Tensor forward(const at::Tensor& ids) override { return at::embedding(weight_, ids); }
  at::Tensor& weight() override { return weight_; }

 private:
  at::Tensor weight_;
};

}  // namespace

std::shared_ptr<Linear> LayerFactory::linear(const LinearSpec& spec) { return std::make_shared<DenseLinear>(spec); }

std::shared_ptr<Embedding> LayerFactory::embedding(int64_t num, int64_t dim, Split) {
  return std::make_shared<DenseEmbedding>(num, dim);
}

std::shared_ptr<LayerNorm> LayerFactory::layer_norm(int64_t dim, double eps) {
  return std::make_shared<LayerNorm>(dim, eps);
}

std::shared_ptr<Attention> LayerFactory::attention(const AttentionSpec& spec) {
  return std::make_shared<Attention>(spec, *this);
}

std::shared_ptr<Mlp> LayerFactory::mlp(const MlpSpec& spec) { return std::make_shared<Mlp>(spec, *this); }

}  // namespace colossal::nn
