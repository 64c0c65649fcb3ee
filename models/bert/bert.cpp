// BERT model: see bert.h.
#include "models/bert/bert.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "src/nn/activation.h"
#include "src/nn/causal_lm.h"

namespace colossal::bert {
namespace {

// The trunk's names, shared by both heads' maps.
std::vector<nn::HfNameRule> encoder_rules() {
  return {
      {"bert.word_embeddings", "bert.embeddings.word_embeddings"},
      {"bert.position_embeddings", "bert.embeddings.position_embeddings"},
      {"bert.token_type_embeddings", "bert.embeddings.token_type_embeddings"},
      {"bert.ln_emb", "bert.embeddings.LayerNorm"},
      {"bert.blocks.*.attn.qkv", "bert.encoder.layer.*.attention.self", false, {"query", "key", "value"}},
      {"bert.blocks.*.attn.proj", "bert.encoder.layer.*.attention.output.dense"},
      {"bert.blocks.*.ln_1", "bert.encoder.layer.*.attention.output.LayerNorm"},
      {"bert.blocks.*.mlp.fc", "bert.encoder.layer.*.intermediate.dense"},
      {"bert.blocks.*.mlp.proj", "bert.encoder.layer.*.output.dense"},
      {"bert.blocks.*.ln_2", "bert.encoder.layer.*.output.LayerNorm"},
  };
}

std::vector<nn::HfNameRule> with(std::vector<nn::HfNameRule> rules, std::vector<nn::HfNameRule> more) {
  rules.insert(rules.end(), more.begin(), more.end());
  return rules;
}

}  // namespace

BertEncoder::BertEncoder(const BertConfig& c, nn::LayerFactory& f) : cfg_(c), cut_(f.stream_cut()) {
  const int64_t e = c.n_embd;
  word_embeddings = register_module("word_embeddings", f.embedding(c.vocab_size, e, nn::Split::Vocab));
  position_embeddings = register_module("position_embeddings", f.embedding(c.max_positions, e));
  token_type_embeddings = register_module("token_type_embeddings", f.embedding(c.type_vocab_size, e));
  ln_emb = register_module("ln_emb", f.layer_norm(e, c.layer_norm_eps));
  const nn::BlockSpec spec{
      .attn = {.width = e, .heads = c.n_head, .causal = false, .bias = true, .dropout = c.dropout, .attn_dropout = c.attn_dropout},
      .mlp = {.width = e, .hidden = c.intermediate, .act = activation_of(c), .bias = true, .dropout = c.dropout},
      .norm_eps = c.layer_norm_eps,
      .pre_norm = false};
  blocks_ = nn::add_blocks(*this, spec, c.n_layer, f);
}

at::Tensor BertEncoder::forward(const nn::EncoderInputs& in, const nn::BlockHooks* hooks) {
  const int64_t t = in.attention_mask.defined() ? in.attention_mask.size(1) : in.ids.size(1);   // the whole sequence's
  TORCH_CHECK(t <= cfg_.max_positions, "sequence of ", t, " tokens exceeds BERT's ", cfg_.max_positions, " positions");
  const at::Tensor positions = in.positions.defined() ? in.positions : at::arange(in.ids.size(1), in.ids.options().dtype(at::kLong));
  const at::Tensor types = in.token_types.defined() ? in.token_types : at::zeros_like(in.ids);
  auto embed = [&] {
    auto x = word_embeddings->forward(in.ids) + position_embeddings->forward(positions) + token_type_embeddings->forward(types);
    x = ln_emb->forward(x);                                                 // [B, T, C]
    return is_training() && cfg_.dropout > 0 ? cut_->dropout(x, cfg_.dropout) : x;
  };
  nn::ForwardOptions o;
  o.mask = nn::padding_mask(in.attention_mask);
  return nn::run_blocks(blocks_, embed, o, hooks);
}

std::vector<std::string> bert_embedding_modules() {
  return {"bert.word_embeddings", "bert.position_embeddings", "bert.token_type_embeddings", "bert.ln_emb"};
}

void bert_padding_row(const BertConfig& c, const std::string& name, const at::Tensor& value) {
  if (name == "bert.word_embeddings.weight" && c.pad_token_id < c.vocab_size) value[c.pad_token_id].zero_();
}

BertForMaskedLM::BertForMaskedLM(const BertConfig& c, nn::LayerFactory& f) : cfg_(c), cut_(f.stream_cut()) {
  bert = register_module("bert", std::make_shared<BertEncoder>(c, f));
  blocks_ = bert->blocks();
  mlm_dense = register_module("mlm_dense", f.linear({.in = c.n_embd, .out = c.n_embd}));
  ln_mlm = register_module("ln_mlm", f.layer_norm(c.n_embd, c.layer_norm_eps));
  mlm_bias = register_parameter("mlm_bias", f.parameter({c.vocab_size}));
}

at::Tensor BertForMaskedLM::mlm_logits(const at::Tensor& hidden) {
  const at::Tensor h = nn::activate(activation_of(cfg_), mlm_dense->forward(hidden));   // [N, C]
  // [N, V] (the tied decoder, gathered when split); the bias is whole, held by every rank
  return bert->token_embedding().project(ln_mlm->forward(h)) + cut_->use(mlm_bias);
}

void BertForMaskedLM::init_parameter(const std::string& name, const at::Tensor& value) const {
  nn::init_normal(name, value, cfg_.init_std);   // drawn for every parameter, so the stream is the same
  if (name == "mlm_bias") value.zero_();
  bert_padding_row(cfg_, name, value);
}

const nn::HfNameMap& BertForMaskedLM::hf_names() const {
  static const nn::HfNameMap map(with(encoder_rules(), {{"mlm_dense", "cls.predictions.transform.dense"},
                                                        {"ln_mlm", "cls.predictions.transform.LayerNorm"},
                                                        {"mlm_bias", "cls.predictions.bias"}}),
                                 // the tied decoder, and what BertForPreTraining checkpoints also hold
                                 {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias", "bert.pooler.dense.weight",
                                  "bert.pooler.dense.bias", "cls.seq_relationship.weight", "cls.seq_relationship.bias",
                                  "bert.embeddings.position_ids"},
                                 "bert.");
  return map;
}

BertForClassification::BertForClassification(const BertConfig& c, nn::LayerFactory& f) : cfg_(c), cut_(f.stream_cut()) {
  bert = register_module("bert", std::make_shared<BertEncoder>(c, f));
  blocks_ = bert->blocks();
  pooler = register_module("pooler", f.linear({.in = c.n_embd, .out = c.n_embd}));
  classifier = register_module("classifier", f.linear({.in = c.n_embd, .out = c.num_labels, .split = nn::Split::Head}));
}

at::Tensor BertForClassification::pooled(const nn::EncoderInputs& in) {
  return at::tanh(pooler->forward(bert->forward(in, block_hooks()).select(1, 0)));   // [B, C]
}

at::Tensor BertForClassification::classify(const nn::EncoderInputs& in) {
  auto x = pooled(in);
  const double p = is_training() ? cfg_.dropout : 0.0;   // HF's classifier_dropout defaults to the hidden dropout
  return classifier->forward(p > 0 ? cut_->dropout(x, p) : x);   // [B, labels]
}

void BertForClassification::init_parameter(const std::string& name, const at::Tensor& value) const {
  nn::init_normal(name, value, cfg_.init_std);
  bert_padding_row(cfg_, name, value);
}

const nn::HfNameMap& BertForClassification::hf_names() const {
  static const nn::HfNameMap map(with(encoder_rules(), {{"pooler", "bert.pooler.dense"}, {"classifier", "classifier"}}),
                                 {"bert.embeddings.position_ids"}, "bert.");
  return map;
}

std::shared_ptr<nn::Model> build(const BertConfig& c, nn::LayerFactory& f) {
  if (c.head == Head::Classifier) return std::make_shared<BertForClassification>(c, f);
  return std::make_shared<BertForMaskedLM>(c, f);
}

}  // namespace colossal::bert
