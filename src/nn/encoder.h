// Interfaces of encoder models (bidirectional attention): a masked language model (the masked_lm
// task drives it), a sequence classifier, and an image classifier (image_classification). The masked-LM head runs on the
// scored positions only, about 15% of the tokens, so no [B, T, V] logits are made in training.
#pragma once
#include <ATen/core/Tensor.h>

#include "src/nn/model.h"

namespace colossal::nn {

struct EncoderInputs {
  at::Tensor ids;             // [B, T] int64
  at::Tensor token_types;     // [B, T] int64 segment ids (undefined: all 0)
  at::Tensor attention_mask;  // [B, T], nonzero on real tokens (undefined: no padding)
  // [T] int64: where the tokens sit in their sequences when a rank holds part of each (sequence
  // parallelism: `ids` and `token_types` are this rank's tokens, `attention_mask` the whole sequences');
  // undefined: 0 .. T-1.
  at::Tensor positions;
};

class MaskedLM : public Model {
 public:
  static constexpr const char* kWhat = "a masked language model (an encoder family with an mlm head)";
  virtual at::Tensor encode(const EncoderInputs& in) = 0;        // [B, T, C] final hidden states
  virtual at::Tensor mlm_logits(const at::Tensor& hidden) = 0;   // [N, C] -> [N, V]
  virtual int64_t vocab_size() const = 0;
  virtual int64_t context_length() const = 0;
};

class SequenceClassifier : public Model {
 public:
  static constexpr const char* kWhat = "a sequence classifier (an encoder family with a classifier head)";
  virtual at::Tensor classify(const EncoderInputs& in) = 0;   // [B, num_labels] logits
  virtual int64_t num_labels() const = 0;
};

class ImageClassifier : public Model {
 public:
  static constexpr const char* kWhat = "an image classifier (a vision family such as vit)";
  virtual at::Tensor classify_images(const at::Tensor& images) = 0;   // [B, channels, H, W] float -> [B, labels]
  virtual int64_t num_labels() const = 0;
  virtual int64_t image_size() const = 0;   // H = W the model was built for
  virtual int64_t channels() const = 0;
};

// A bool mask [B, 1, 1, T] letting every query see the real keys of its sequence (undefined when
// `attention_mask` is: every key is real).
at::Tensor padding_mask(const at::Tensor& attention_mask);

}  // namespace colossal::nn
