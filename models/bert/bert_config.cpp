// BERT configuration conversions: see bert_config.h.
#include "models/bert/bert_config.h"

#include "src/core/error.h"
#include "src/core/text.h"
#include "src/io/hf_config.h"

namespace colossal::bert {
namespace {

// HF's hidden_act names and ours.
struct ActName {
  const char* hf;
  const char* ours;
  nn::Act act;
};
constexpr ActName kActs[] = {{"gelu", "gelu", nn::Act::Gelu},
                             {"relu", "relu", nn::Act::Relu},
                             {"gelu_new", "gelu_tanh", nn::Act::GeluTanh},
                             {"gelu_pytorch_tanh", "gelu_tanh", nn::Act::GeluTanh}};

const char* architecture_of(Head head) { return head == Head::Classifier ? "BertForSequenceClassification" : "BertForMaskedLM"; }

}  // namespace

BertConfig from_recipe(const ModelConfig& m) {
  BertConfig c;
  c.n_layer = m.n_layer, c.n_head = m.n_head, c.n_embd = m.n_embd;
  c.intermediate = m.n_inner ? m.n_inner : 4 * m.n_embd;
  c.max_positions = m.block_size, c.vocab_size = m.vocab_size;
  c.type_vocab_size = m.type_vocab_size;
  c.dropout = m.dropout;
  c.attn_dropout = m.attn_dropout < 0 ? m.dropout : m.attn_dropout;
  c.layer_norm_eps = m.layer_norm_eps, c.init_std = m.init_std;
  c.activation = "gelu";
  for (const auto& a : kActs)
    if (m.activation == a.ours) c.activation = a.hf;
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
  for (const auto& a : kActs)
    if (c.activation == a.hf) m.activation = a.ours;
  m.head = c.head == Head::Classifier ? "classifier" : "mlm";
  m.num_labels = c.num_labels;
  return m;
}

nn::Act activation_of(const BertConfig& c) {
  for (const auto& a : kActs)
    if (c.activation == a.hf) return a.act;
  throw Error("BERT: unknown activation \"" + c.activation + "\"");
}

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
    nlohmann::json id2label = c.id2label, label2id = nlohmann::json::object();
    if (!id2label.is_object() || static_cast<int64_t>(id2label.size()) != c.num_labels) {
      id2label = nlohmann::json::object();
      for (int64_t i = 0; i < c.num_labels; ++i) id2label[std::to_string(i)] = "LABEL_" + std::to_string(i);
    }
    for (const auto& [id, label] : id2label.items()) label2id[label.get<std::string>()] = std::stoll(id);
    j["id2label"] = id2label;
    j["label2id"] = label2id;
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
  c.activation = r.choice("hidden_act", "gelu", {"gelu", "relu", "gelu_new", "gelu_pytorch_tanh"});
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
    if (j.contains("id2label") && j["id2label"].is_object() && !j["id2label"].empty()) {
      c.id2label = j["id2label"];
      c.num_labels = static_cast<int64_t>(c.id2label.size());
    } else {
      c.num_labels = r.size("num_labels", c.num_labels, 1 << 20);
    }
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
