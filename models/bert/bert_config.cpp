// BERT configuration conversions: see bert_config.h.
#include "models/bert/bert_config.h"

#include "models/hf_activation.h"
#include "src/core/error.h"
#include "src/core/text.h"
#include "src/io/hf_config.h"

namespace colossal::bert {
namespace {

const char* architecture_of(Head head) { return head == Head::Classifier ? "BertForSequenceClassification" : "BertForMaskedLM"; }

}  // namespace

BertConfig from_recipe(const ModelConfig& m) {
  BertConfig c;
  c.n_layer = m.n_layer, c.n_head = m.n_head, c.n_embd = m.n_embd;
  c.intermediate = m.n_inner ? m.n_inner : 4 * m.n_embd;
  c.max_positions = m.block_size, c.vocab_size = m.vocab_size;
  c.type_vocab_size = m.type_vocab_size;
  c.dropout = m.dropout;
  c.attn_dropout = m.attention_dropout();
  c.layer_norm_eps = m.layer_norm_eps, c.init_std = m.init_std;
  c.activation = hf_activation_of_recipe(m.activation, "gelu");
  c.head = m.head == "classifier" ? Head::Classifier : Head::MaskedLM;
  c.num_labels = m.num_labels;
  // pre_norm is not read: BERT normalises after each residual add whatever the key says.
  if (!m.bias) throw ModelKeyError("bias", "= false: BERT's linear layers and LayerNorms have biases (valid: true)");
  return c;
}

ModelConfig to_model_config(const BertConfig& c) {
  ModelConfig m;
  m.family = "bert";
  m.n_layer = c.n_layer, m.n_head = c.n_head, m.n_embd = c.n_embd;
  m.n_inner = c.intermediate;
  m.block_size = c.max_positions, m.vocab_size = c.vocab_size;
  m.type_vocab_size = c.type_vocab_size;
  m.dropout = c.dropout, m.attn_dropout = c.attn_dropout;
  m.layer_norm_eps = c.layer_norm_eps, m.init_std = c.init_std;
  m.pre_norm = false;
  m.activation = recipe_activation_of_hf(c.activation);
  m.head = c.head == Head::Classifier ? "classifier" : "mlm";
  m.num_labels = c.num_labels;
  return m;
}

nn::Act activation_of(const BertConfig& c) { return activation_of_hf(c.activation, "BERT"); }

nlohmann::json to_hf_config(const BertConfig& c) {
  nlohmann::json j = {
      {"architectures", {architecture_of(c.head)}},
      {"model_type", "bert"},
      {"vocab_size", c.vocab_size},
      {"hidden_size", c.n_embd},
      {"num_hidden_layers", c.n_layer},
      {"num_attention_heads", c.n_head},
      {"intermediate_size", c.intermediate},
      {"max_position_embeddings", c.max_positions},
      {"type_vocab_size", c.type_vocab_size},
      {"hidden_act", c.activation},
      {"hidden_dropout_prob", c.dropout},
      {"attention_probs_dropout_prob", c.attn_dropout},
      {"layer_norm_eps", c.layer_norm_eps},
      {"initializer_range", c.init_std},
      {"pad_token_id", c.pad_token_id},
      {"position_embedding_type", "absolute"},
      {"is_decoder", false},
      {"tie_word_embeddings", true},
      {"torch_dtype", "float32"},
  };
  if (c.head == Head::Classifier) {
    write_labels(j, c.id2label, c.num_labels);
    j["problem_type"] = "single_label_classification";
  }
  return j;
}

BertConfig from_hf_config(const nlohmann::json& j, const std::string& path) {
  const HfConfigReader r(j, path, "bert", "BERT");
  BertConfig c;
  c.n_layer = r.size("num_hidden_layers", 1024);
  c.n_head = r.size("num_attention_heads", 1024);
  c.n_embd = r.size("hidden_size", 1 << 17);
  c.intermediate = r.size("intermediate_size", 1 << 20);
  c.max_positions = r.size("max_position_embeddings", 1 << 20);
  c.vocab_size = r.size("vocab_size", 1 << 24);
  c.type_vocab_size = r.size("type_vocab_size", c.type_vocab_size, 1 << 10);
  c.dropout = r.real("hidden_dropout_prob", c.dropout, 0.0, 1.0);
  c.attn_dropout = r.real("attention_probs_dropout_prob", c.attn_dropout, 0.0, 1.0);
  c.layer_norm_eps = r.real("layer_norm_eps", c.layer_norm_eps, 0.0, 1.0, true);
  c.init_std = r.real("initializer_range", c.init_std, 0.0, 1.0, true);
  c.activation = r.choice("hidden_act", "gelu", hf_activation_names());
  c.pad_token_id = r.index("pad_token_id", c.pad_token_id, c.vocab_size - 1);
  if (c.n_embd % c.n_head != 0)
    r.fail("num_attention_heads = " + std::to_string(c.n_head) + " does not divide hidden_size = " + std::to_string(c.n_embd));
  r.fixed("position_embedding_type", {"absolute"}, "learned absolute positions: \"absolute\"");
  r.fixed("is_decoder", {false}, "a bidirectional encoder: false");
  r.fixed("add_cross_attention", {false}, "no cross-attention: false");
  const std::string arch = r.first_choice("architectures", "BertForMaskedLM",
                                          {"BertForMaskedLM", "BertForPreTraining", "BertForSequenceClassification"});
  if (arch == "BertForSequenceClassification") {
    c.head = Head::Classifier;
    c.id2label = r.id2label();
    c.num_labels = c.id2label.is_null() ? r.size("num_labels", c.num_labels, 1 << 20) : static_cast<int64_t>(c.id2label.size());
    r.fixed("problem_type", {"single_label_classification"}, "one label per sequence: \"single_label_classification\"");
  }
  return c;
}

int64_t parameter_count(const BertConfig& c) {
  const int64_t e = c.n_embd, f = c.intermediate;
  // Per block: q/k/v/out (4C^2 + 4C), 2 LayerNorms (4C), intermediate and output (2CF + F + C).
  const int64_t block = 4 * e * e + 4 * e + 4 * e + 2 * e * f + f + e;
  const int64_t embeddings = (c.vocab_size + c.max_positions + c.type_vocab_size) * e + 2 * e;
  const int64_t head = c.head == Head::Classifier ? (e * e + e) + (e * c.num_labels + c.num_labels)   // pooler + classifier
                                                  : (e * e + e) + 2 * e + c.vocab_size;               // transform + LN + bias
  return embeddings + c.n_layer * block + head;
}

}  // namespace colossal::bert
