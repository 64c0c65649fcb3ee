// BERT: token, position and segment embeddings with a LayerNorm, post-LN blocks of bidirectional
// self-attention (padding masked) and an exact-GELU MLP, then a head: the masked-LM head
// (dense + GELU + LayerNorm, decoder tied to the token embedding, its own bias) or the pooler
// (tanh of a dense layer on token 0) and a classifier. Built from src/nn blocks; HF keeps query, key
// and value as three tensors, which the name map joins into our qkv.
#pragma once
#include <memory>
#include <vector>

#include "models/bert/bert_config.h"
#include "src/nn/block.h"
#include "src/nn/block_hooks.h"
#include "src/nn/encoder.h"
#include "src/nn/factory.h"
#include "src/nn/layer_norm.h"

namespace colossal::bert {

// HF initialises the [PAD] row of the token embedding to zeros: applied to `value` when `name` is the
// trunk's token embedding ("bert.word_embeddings.weight" in either head's model).
void bert_padding_row(const BertConfig& c, const std::string& name, const at::Tensor& value);

// The shared trunk, registered as "bert" in either head's model.
class BertEncoder : public nn::Module {
 public:
  BertEncoder(const BertConfig& c, nn::LayerFactory& f);
  // [B, T] -> [B, T, C], each block inside `hooks` (the owning model's chain) when given.
  at::Tensor forward(const nn::EncoderInputs& in, const nn::BlockHooks* hooks = nullptr);
  const std::vector<std::shared_ptr<nn::TransformerBlock>>& blocks() const { return blocks_; }
  nn::Embedding& token_embedding() { return *word_embeddings; }

 private:
  BertConfig cfg_;
  std::shared_ptr<const nn::StreamCut> cut_;   // dropout on the layout's piece of the stream
  std::shared_ptr<nn::Embedding> word_embeddings, position_embeddings, token_type_embeddings;
  std::shared_ptr<nn::LayerNorm> ln_emb;
  std::vector<std::shared_ptr<nn::TransformerBlock>> blocks_;
};

// The encoder's embedding modules (both heads' first pipeline stage).
std::vector<std::string> bert_embedding_modules();

class BertForMaskedLM : public nn::MaskedLM {
 public:
  BertForMaskedLM(const BertConfig& c, nn::LayerFactory& f);
  at::Tensor encode(const nn::EncoderInputs& in) override { return bert->forward(in, block_hooks()); }
  at::Tensor mlm_logits(const at::Tensor& hidden) override;
  int64_t vocab_size() const override { return cfg_.vocab_size; }
  int64_t context_length() const override { return cfg_.max_positions; }
  std::vector<std::string> embedding_modules() const override { return bert_embedding_modules(); }
  std::vector<std::string> tied_to_head() const override { return {"bert.word_embeddings"}; }   // the MLM decoder
  void init_parameter(const std::string& name, const at::Tensor& value) const override;
  const nn::HfNameMap& hf_names() const override;
  nlohmann::json hf_config() const override { return to_hf_config(cfg_); }

 private:
  BertConfig cfg_;
  std::shared_ptr<BertEncoder> bert;
  std::shared_ptr<nn::Linear> mlm_dense;
  std::shared_ptr<nn::LayerNorm> ln_mlm;
  std::shared_ptr<const nn::StreamCut> cut_;   // how the layout holds the stream (the bias's gradient sums over split rows)
  at::Tensor mlm_bias;   // [V]
};

class BertForClassification : public nn::SequenceClassifier {
 public:
  BertForClassification(const BertConfig& c, nn::LayerFactory& f);
  at::Tensor classify(const nn::EncoderInputs& in) override;
  at::Tensor pooled(const nn::EncoderInputs& in);   // [B, C]: tanh(pooler(h[:, 0]))
  int64_t num_labels() const override { return cfg_.num_labels; }
  std::vector<std::string> embedding_modules() const override { return bert_embedding_modules(); }
  void init_parameter(const std::string& name, const at::Tensor& value) const override;
  const nn::HfNameMap& hf_names() const override;
  nlohmann::json hf_config() const override { return to_hf_config(cfg_); }

 private:
  BertConfig cfg_;
  std::shared_ptr<const nn::StreamCut> cut_;   // the classifier's dropout on the layout's piece
  std::shared_ptr<BertEncoder> bert;
  std::shared_ptr<nn::Linear> pooler, classifier;
};

std::shared_ptr<nn::Model> build(const BertConfig& c, nn::LayerFactory& f);

}  // namespace colossal::bert
