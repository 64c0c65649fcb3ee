// BERT family configuration (Google's bidirectional encoder, bert-tiny to bert-large), and its
// conversion to and from Hugging Face's BertConfig (config.json). The head is part of the config, as
// HF's architectures field says: a masked-LM head (BertForMaskedLM, also read from BertForPreTraining
// checkpoints such as bert-base-uncased) or a sequence classifier (BertForSequenceClassification).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "src/core/recipe.h"
#include "src/nn/factory.h"

namespace colossal::bert {

enum class Head { MaskedLM, Classifier };

struct BertConfig {
  int64_t n_layer = 12, n_head = 12, n_embd = 768;   // num_hidden_layers, num_attention_heads, hidden_size
  int64_t intermediate = 3072;                       // intermediate_size
  int64_t max_positions = 512;                       // max_position_embeddings
  int64_t vocab_size = 30522;
  int64_t type_vocab_size = 2;                       // segment (token type) embeddings
  double dropout = 0.1, attn_dropout = 0.1;          // hidden_dropout_prob, attention_probs_dropout_prob
  double layer_norm_eps = 1e-12;
  double init_std = 0.02;                            // initializer_range
  std::string activation = "gelu";                   // hidden_act (exact GELU)
  int64_t pad_token_id = 0;
  Head head = Head::MaskedLM;
  int64_t num_labels = 2;                            // classifier head
  nlohmann::json id2label;                           // kept as the source config wrote it (null: generated)
};

BertConfig from_recipe(const ModelConfig& m);   // ModelKeyError for a value BERT cannot take
ModelConfig to_model_config(const BertConfig& c);
nlohmann::json to_hf_config(const BertConfig& c);
BertConfig from_hf_config(const nlohmann::json& j, const std::string& path);   // Error names path and key
nn::Act activation_of(const BertConfig& c);
int64_t parameter_count(const BertConfig& c);   // the MLM decoder is tied to the word embeddings

}  // namespace colossal::bert
