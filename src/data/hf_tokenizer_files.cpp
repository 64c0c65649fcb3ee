// Hugging Face tokenizer files -> HfTokenizerSpec: see hf_tokenizer_files.h.
#include "src/data/hf_tokenizer_files.h"

#include <nlohmann/json.hpp>

#include "src/core/error.h"
#include "src/core/json_value.h"
#include "src/core/text.h"
#include "src/data/byte_level.h"
#include "src/data/hf_tokenizer.h"

namespace colossal {
namespace {

using nlohmann::json;

// Typed reads from one JSON file; every failure names the file and the path inside it.
class Reader {
 public:
  Reader(std::string file) : file_(std::move(file)) {}
  [[noreturn]] void fail(const std::string& at, const std::string& message) const {
    throw Error("tokenizer " + file_ + ": " + (at.empty() ? "" : at + " ") + message);
  }
  json parse(const std::string& text) const {
    json j = parse_json(text, "tokenizer " + file_);
    if (!j.is_object()) fail("", "holds " + std::string(j.type_name()) + ", not a JSON object");
    return j;
  }
  const json* find(const json& obj, const char* key) const {   // null when absent or null
    auto it = obj.find(key);
    return it == obj.end() || it->is_null() ? nullptr : &*it;
  }
  bool flag(const json& obj, const char* key, bool fallback, const std::string& at) const {
    const json* v = find(obj, key);
    if (!v) return fallback;
    if (!v->is_boolean()) fail(at + key, "= " + v->dump() + " (expected true or false)");
    return v->get<bool>();
  }
  std::string text(const json& v, const std::string& at) const {
    if (!v.is_string()) fail(at, "= " + short_dump(v) + " (expected a string)");
    return v.get<std::string>();
  }
  int id(const json& v, const std::string& at) const {
    const auto n = whole_number(v);
    if (!n || *n > static_cast<uint64_t>(kMaxId)) fail(at, "= " + short_dump(v) + " (expected a token id in [0, " + std::to_string(kMaxId) + "])");
    return static_cast<int>(*n);
  }
  const json& object(const json& obj, const char* key, const std::string& at) const {
    const json* v = find(obj, key);
    if (!v || !v->is_object()) fail(at + key, v ? "= " + short_dump(*v) + " (expected an object)" : "is missing");
    return *v;
  }
  const json& array(const json& obj, const char* key, const std::string& at) const {
    const json* v = find(obj, key);
    if (!v || !v->is_array()) fail(at + key, v ? "= " + short_dump(*v) + " (expected an array)" : "is missing");
    return *v;
  }
  std::string type_of(const json& obj, const std::string& at) const {
    if (!obj.is_object()) fail(at, "= " + short_dump(obj) + " (expected an object)");
    const json* t = find(obj, "type");
    if (!t) fail(at + "type", "is missing");
    return text(*t, at + "type");
  }
  static std::string short_dump(const json& v) {
    std::string s = v.dump();
    return s.size() > 60 ? s.substr(0, 57) + "..." : s;
  }
  static constexpr int64_t kMaxId = 100'000'000;   // far above any vocabulary, far below int overflow

 private:
  std::string file_;
};

std::unordered_map<std::string, int> read_vocab(const Reader& r, const json& vocab, const std::string& at) {
  if (!vocab.is_object()) r.fail(at, "= " + Reader::short_dump(vocab) + " (expected an object of token -> id)");
  std::unordered_map<std::string, int> out;
  out.reserve(vocab.size());
  for (const auto& [token, id] : vocab.items()) out.emplace(token, r.id(id, at + "[\"" + token + "\"]"));
  return out;
}

// A merge as "left right" (transformers before 4.45 and merges.txt) or ["left", "right"].
std::pair<std::string, std::string> read_merge(const Reader& r, const json& m, const std::string& at) {
  if (m.is_array()) {
    if (m.size() != 2) r.fail(at, "= " + Reader::short_dump(m) + " (expected two tokens)");
    return {r.text(m[0], at + "[0]"), r.text(m[1], at + "[1]")};
  }
  const std::string s = r.text(m, at);
  const size_t space = s.find(' ');
  if (space == std::string::npos || space == 0 || space + 1 == s.size())
    r.fail(at, "= \"" + s + "\" (expected two tokens separated by a space)");
  return {s.substr(0, space), s.substr(space + 1)};
}

// Special-token roles and options from special_tokens_map.json and tokenizer_config.json (which wins
// where both name a role). A token is written as its text or as {"content": text, ...}.
struct TokenizerConfig {
  json config = json::object();
  std::map<std::string, std::string> roles;
  std::vector<AddedToken> added;   // added_tokens_decoder
};

TokenizerConfig read_config(const TokenizerFiles& files, const std::string& dir) {
  TokenizerConfig c;
  for (const char* name : {"special_tokens_map.json", "tokenizer_config.json"}) {
    auto it = files.find(name);
    if (it == files.end()) continue;
    Reader r(dir + "/" + name);
    json j = r.parse(it->second);
    for (const char* role : {"bos", "eos", "unk", "pad", "sep", "cls", "mask"}) {
      const std::string key = std::string(role) + "_token";
      const json* v = r.find(j, key.c_str());
      if (!v) continue;
      c.roles[role] = v->is_object() ? r.text(r.object(j, key.c_str(), "").value("content", json()), key + ".content") : r.text(*v, key);
    }
    if (std::string(name) == "tokenizer_config.json") {
      c.config = j;
      if (const json* dec = r.find(j, "added_tokens_decoder")) {
        if (!dec->is_object()) r.fail("added_tokens_decoder", "= " + Reader::short_dump(*dec) + " (expected an object of id -> token)");
        for (const auto& [key, t] : dec->items()) {
          const std::string at = "added_tokens_decoder[\"" + key + "\"].";
          const auto id = parse_whole(key);
          if (!id || *id > static_cast<uint64_t>(Reader::kMaxId)) r.fail("added_tokens_decoder", "key \"" + key + "\" is not a token id");
          if (!t.is_object()) r.fail(at.substr(0, at.size() - 1), "= " + Reader::short_dump(t) + " (expected an object)");
          c.added.push_back({r.text(t.value("content", json()), at + "content"), static_cast<int>(*id), r.flag(t, "special", false, at),
                             r.flag(t, "lstrip", false, at), r.flag(t, "rstrip", false, at), r.flag(t, "single_word", false, at)});
        }
      }
    }
  }
  return c;
}

// Roles no config names, guessed from the conventional spellings among the special tokens.
void default_roles(HfTokenizerSpec& spec) {
  const std::vector<std::pair<const char*, std::vector<const char*>>> conventions = {
      {"eos", {"</s>", "<|endoftext|>", "<eos>"}}, {"bos", {"<s>", "<bos>"}},     {"pad", {"[PAD]", "<pad>"}},
      {"unk", {"[UNK]", "<unk>"}},                 {"sep", {"[SEP]", "</s>"}},     {"cls", {"[CLS]", "<s>"}},
      {"mask", {"[MASK]", "<mask>"}}};
  for (const auto& [role, names] : conventions) {
    if (spec.roles.count(role)) continue;
    for (const char* name : names)
      if (std::any_of(spec.added.begin(), spec.added.end(), [&](const AddedToken& t) { return t.special && t.content == name; })) {
        spec.roles[role] = name;
        break;
      }
  }
}

int template_id(const HfTokenizerSpec& spec, const std::string& token, const Reader& r, const std::string& at) {
  for (const auto& t : spec.added)
    if (t.content == token) return t.id;
  if (auto id = (spec.bpe ? spec.bpe->vocab() : spec.wordpiece->vocab()).id_of(token)) return *id;
  r.fail(at, "names \"" + token + "\", which is not in the vocabulary");
}

// The post-processor's single-sequence template.
void read_post_processor(HfTokenizerSpec& spec, const json& pp, const Reader& r, const std::string& at) {
  const std::string type = r.type_of(pp, at);
  if (type == "ByteLevel") return;   // only adjusts offsets
  if (type == "Sequence") {
    const json& list = r.array(pp, "processors", at);
    for (size_t i = 0; i < list.size(); ++i) read_post_processor(spec, list[i], r, at + "processors[" + std::to_string(i) + "].");
    return;
  }
  if (type == "BertProcessing" || type == "RobertaProcessing") {   // cls A sep, each as [token, id]
    auto pair_id = [&](const char* key) {
      const json& v = r.array(pp, key, at);
      if (v.size() != 2) r.fail(at + key, "= " + Reader::short_dump(v) + " (expected [token, id])");
      return r.id(v[1], at + key + "[1]");
    };
    spec.template_before = {pair_id("cls")};
    spec.template_after = {pair_id("sep")};
    return;
  }
  if (type != "TemplateProcessing")
    r.fail(at + "type", "= \"" + type + "\" is not supported (supported: TemplateProcessing, BertProcessing, RobertaProcessing, ByteLevel, Sequence)");
  const json& specials = r.object(pp, "special_tokens", at);
  const json& single = r.array(pp, "single", at);
  bool seen_sequence = false;
  for (size_t i = 0; i < single.size(); ++i) {
    const std::string piece_at = at + "single[" + std::to_string(i) + "]";
    const json& piece = single[i];
    if (!piece.is_object() || piece.size() != 1) r.fail(piece_at, "= " + Reader::short_dump(piece) + " (expected {\"SpecialToken\": ...} or {\"Sequence\": ...})");
    if (piece.contains("Sequence")) {
      if (seen_sequence) r.fail(piece_at, "is a second sequence in a single-sequence template");
      seen_sequence = true;
      continue;
    }
    const json& st = r.object(piece, "SpecialToken", piece_at + ".");
    const std::string name = r.text(st.value("id", json()), piece_at + ".SpecialToken.id");
    const json* entry = r.find(specials, name.c_str());
    std::vector<int>& side = seen_sequence ? spec.template_after : spec.template_before;
    if (!entry) {
      side.push_back(template_id(spec, name, r, piece_at));
      continue;
    }
    const json& ids = r.array(*entry, "ids", at + "special_tokens[\"" + name + "\"].");
    for (size_t k = 0; k < ids.size(); ++k) side.push_back(r.id(ids[k], at + "special_tokens[\"" + name + "\"].ids[" + std::to_string(k) + "]"));
  }
  if (!seen_sequence) r.fail(at + "single", "has no $A sequence");
}

void read_added_tokens(HfTokenizerSpec& spec, const json& j, const Reader& r) {
  const json* list = r.find(j, "added_tokens");
  if (!list) return;
  if (!list->is_array()) r.fail("added_tokens", "= " + Reader::short_dump(*list) + " (expected an array)");
  for (size_t i = 0; i < list->size(); ++i) {
    const std::string at = "added_tokens[" + std::to_string(i) + "].";
    const json& t = (*list)[i];
    if (!t.is_object()) r.fail(at.substr(0, at.size() - 1), "= " + Reader::short_dump(t) + " (expected an object)");
    spec.added.push_back({r.text(t.value("content", json()), at + "content"), r.id(t.value("id", json()), at + "id"),
                          r.flag(t, "special", false, at), r.flag(t, "lstrip", false, at), r.flag(t, "rstrip", false, at),
                          r.flag(t, "single_word", false, at)});
  }
}

HfTokenizerSpec from_tokenizer_json(const std::string& text, const std::string& dir) {
  const Reader r(dir + "/tokenizer.json");
  const json j = r.parse(text);
  HfTokenizerSpec spec;
  read_added_tokens(spec, j, r);

  if (const json* n = r.find(j, "normalizer")) {
    const std::string type = r.type_of(*n, "normalizer.");
    if (type != "BertNormalizer") r.fail("normalizer.type", "= \"" + type + "\" is not supported (supported: none, BertNormalizer)");
    BertNormalizer bn;
    bn.clean_text = r.flag(*n, "clean_text", true, "normalizer.");
    bn.handle_chinese_chars = r.flag(*n, "handle_chinese_chars", true, "normalizer.");
    if (r.find(*n, "strip_accents")) bn.strip_accents = r.flag(*n, "strip_accents", false, "normalizer.");
    bn.lowercase = r.flag(*n, "lowercase", true, "normalizer.");
    spec.normalizer = bn;
  }

  const json& model = r.object(j, "model", "");
  const std::string model_type = r.find(model, "type") ? r.type_of(model, "model.") : (model.contains("merges") ? "BPE" : "WordPiece");
  const json* pre = r.find(j, "pre_tokenizer");
  std::string pre_type = pre ? r.type_of(*pre, "pre_tokenizer.") : "none";
  // BLOOM's: Sequence [Split (its pattern, Isolated), ByteLevel without the GPT-2 pattern].
  if (pre_type == "Sequence") {
    const json& list = r.array(*pre, "pretokenizers", "pre_tokenizer.");
    const bool bloom = list.size() == 2 && r.type_of(list[0], "pre_tokenizer.pretokenizers[0].") == "Split" &&
                       r.type_of(list[1], "pre_tokenizer.pretokenizers[1].") == "ByteLevel";
    const json* pattern = bloom ? r.find(list[0], "pattern") : nullptr;
    const json* regex = pattern && pattern->is_object() ? r.find(*pattern, "Regex") : nullptr;
    if (!regex || *regex != byte_level::kBloomSplitPattern || list[0].value("behavior", json()) != "Isolated" ||
        list[0].value("invert", json(false)) != false || r.flag(list[1], "use_regex", true, "pre_tokenizer.pretokenizers[1]."))
      r.fail("pre_tokenizer", "is a Sequence other than BLOOM's (Split on its pattern, Isolated, then ByteLevel with use_regex "
                              "false), which is the only one supported");
    spec.bloom_split = true;
    pre = &list[1];
    pre_type = "ByteLevel";
  }
  if (model_type == "BPE") {
    if (pre_type != "ByteLevel")
      r.fail("pre_tokenizer", "is " + pre_type + ", but a BPE model is supported only byte-level (pre_tokenizer ByteLevel, as GPT-2, OPT and RoBERTa)");
    spec.split = HfTokenizerSpec::Split::byte_level;
    spec.add_prefix_space = r.flag(*pre, "add_prefix_space", false, "pre_tokenizer.");
    spec.use_regex = r.flag(*pre, "use_regex", true, "pre_tokenizer.");
    if (const json* d = r.find(model, "dropout"); d && !(d->is_number() && d->get<double>() == 0.0))
      r.fail("model.dropout", "= " + d->dump() + " is not supported (BPE dropout samples tokenizations; use null)");
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
      if (const json* v = r.find(model, key); v && !(v->is_string() && v->get<std::string>().empty()))
        r.fail(std::string("model.") + key, "= " + Reader::short_dump(*v) + " is not supported by byte-level BPE (use null)");
    if (r.flag(model, "byte_fallback", false, "model."))
      r.fail("model.byte_fallback", "= true is not supported (byte-level BPE covers every byte already)");
    BpeOptions opt;
    if (const json* unk = r.find(model, "unk_token")) opt.unk_token = r.text(*unk, "model.unk_token");
    opt.fuse_unk = r.flag(model, "fuse_unk", false, "model.");
    opt.ignore_merges = r.flag(model, "ignore_merges", false, "model.");
    const json& merges = r.array(model, "merges", "model.");
    std::vector<std::pair<std::string, std::string>> pairs;
    pairs.reserve(merges.size());
    for (size_t i = 0; i < merges.size(); ++i) pairs.push_back(read_merge(r, merges[i], "model.merges[" + std::to_string(i) + "]"));
    spec.bpe = std::make_shared<BpeModel>(read_vocab(r, r.object(model, "vocab", "model."), "model.vocab"), pairs, opt,
                                          "tokenizer " + dir + "/tokenizer.json");
  } else if (model_type == "WordPiece") {
    if (pre_type != "BertPreTokenizer")
      r.fail("pre_tokenizer", "is " + pre_type + ", but a WordPiece model is supported with BertPreTokenizer (as BERT)");
    spec.split = HfTokenizerSpec::Split::bert;
    const json* unk = r.find(model, "unk_token");
    const json* prefix = r.find(model, "continuing_subword_prefix");
    int64_t max_chars = 100;
    if (const json* m = r.find(model, "max_input_chars_per_word")) max_chars = r.id(*m, "model.max_input_chars_per_word");
    spec.wordpiece = std::make_shared<WordPieceModel>(read_vocab(r, r.object(model, "vocab", "model."), "model.vocab"),
                                                      unk ? r.text(*unk, "model.unk_token") : "[UNK]",
                                                      prefix ? r.text(*prefix, "model.continuing_subword_prefix") : "##", max_chars,
                                                      "tokenizer " + dir + "/tokenizer.json");
  } else {
    r.fail("model.type", "= \"" + model_type + "\" is not supported (supported: BPE with a ByteLevel pre-tokenizer, WordPiece)");
  }

  if (const json* d = r.find(j, "decoder")) {
    const std::string type = r.type_of(*d, "decoder.");
    if (type != (spec.bpe ? "ByteLevel" : "WordPiece"))
      r.fail("decoder.type", "= \"" + type + "\" does not fit the " + model_type + " model (expected " + (spec.bpe ? "ByteLevel" : "WordPiece") + ")");
    if (spec.wordpiece) spec.wordpiece_cleanup = r.flag(*d, "cleanup", true, "decoder.");
  }
  if (const json* pp = r.find(j, "post_processor")) read_post_processor(spec, *pp, r, "post_processor.");
  return spec;
}

HfTokenizerSpec from_vocab_and_merges(const std::string& vocab_text, const std::string& merges_text, const TokenizerConfig& cfg,
                                      const std::string& dir) {
  const Reader rv(dir + "/vocab.json"), rm(dir + "/merges.txt"), rc(dir + "/tokenizer_config.json");
  HfTokenizerSpec spec;
  std::vector<std::pair<std::string, std::string>> pairs;
  size_t line_no = 0;
  for (size_t pos = 0; pos < merges_text.size();) {
    size_t end = merges_text.find('\n', pos);
    if (end == std::string::npos) end = merges_text.size();
    std::string line = merges_text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (line_no == 1 && line.starts_with("#version"))) continue;
    pairs.push_back(read_merge(rm, json(line), "line " + std::to_string(line_no)));
  }
  BpeOptions opt;
  spec.bpe = std::make_shared<BpeModel>(read_vocab(rv, rv.parse(vocab_text), ""), pairs, opt, "tokenizer " + dir + "/vocab.json + merges.txt");
  spec.split = HfTokenizerSpec::Split::byte_level;
  spec.add_prefix_space = rc.flag(cfg.config, "add_prefix_space", false, "");
  // The roles' tokens are special: typed into a text they are single ids, as the slow GPT-2 tokenizer does.
  for (const auto& [role, token] : cfg.roles)
    if (auto id = spec.bpe->vocab().id_of(token)) spec.added.push_back({token, *id, true});
  if (rc.flag(cfg.config, "add_bos_token", false, "") && cfg.roles.count("bos"))
    spec.template_before = {template_id(spec, cfg.roles.at("bos"), rc, "bos_token")};
  if (rc.flag(cfg.config, "add_eos_token", false, "") && cfg.roles.count("eos"))
    spec.template_after = {template_id(spec, cfg.roles.at("eos"), rc, "eos_token")};
  return spec;
}

HfTokenizerSpec from_vocab_txt(const std::string& vocab_text, const TokenizerConfig& cfg, const std::string& dir) {
  const Reader rc(dir + "/tokenizer_config.json");
  std::unordered_map<std::string, int> vocab;
  int id = 0;
  for (size_t pos = 0; pos < vocab_text.size(); ++id) {
    size_t end = vocab_text.find('\n', pos);
    if (end == std::string::npos) end = vocab_text.size();
    std::string token = vocab_text.substr(pos, end - pos);
    if (!token.empty() && token.back() == '\r') token.pop_back();
    vocab.emplace(std::move(token), id);   // a repeated token keeps its first id
    pos = end + 1;
  }
  HfTokenizerSpec spec;
  BertNormalizer bn;
  bn.lowercase = rc.flag(cfg.config, "do_lower_case", true, "");
  bn.handle_chinese_chars = rc.flag(cfg.config, "tokenize_chinese_chars", true, "");
  if (rc.find(cfg.config, "strip_accents")) bn.strip_accents = rc.flag(cfg.config, "strip_accents", false, "");
  spec.normalizer = bn;
  spec.split = HfTokenizerSpec::Split::bert;
  spec.wordpiece = std::make_shared<WordPieceModel>(std::move(vocab), cfg.roles.count("unk") ? cfg.roles.at("unk") : "[UNK]", "##", 100,
                                                    "tokenizer " + dir + "/vocab.txt");
  for (const auto& [role, fallback] : std::map<std::string, std::string>{
           {"pad", "[PAD]"}, {"unk", "[UNK]"}, {"cls", "[CLS]"}, {"sep", "[SEP]"}, {"mask", "[MASK]"}}) {   // BertTokenizer's defaults
    const std::string& token = spec.roles[role] = cfg.roles.count(role) ? cfg.roles.at(role) : fallback;
    if (auto tid = spec.wordpiece->vocab().id_of(token)) spec.added.push_back({token, *tid, true});
  }
  spec.template_before = {template_id(spec, spec.roles["cls"], rc, "cls_token")};
  spec.template_after = {template_id(spec, spec.roles["sep"], rc, "sep_token")};
  return spec;
}

}  // namespace

std::shared_ptr<const TokenizerImpl> hf_tokenizer_from_files(const TokenizerFiles& files, const std::string& dir) {
  const TokenizerConfig cfg = read_config(files, dir);
  auto has = [&](const char* name) { return files.count(name) > 0; };
  HfTokenizerSpec spec;
  if (has("tokenizer.json")) spec = from_tokenizer_json(files.at("tokenizer.json"), dir);
  else if (has("vocab.json") && has("merges.txt")) spec = from_vocab_and_merges(files.at("vocab.json"), files.at("merges.txt"), cfg, dir);
  else if (has("vocab.txt")) spec = from_vocab_txt(files.at("vocab.txt"), cfg, dir);
  else return nullptr;
  for (const auto& t : cfg.added)   // tokens the config adds beyond the vocabulary files
    if (std::none_of(spec.added.begin(), spec.added.end(), [&](const AddedToken& a) { return a.id == t.id; })) spec.added.push_back(t);
  for (const auto& [role, token] : cfg.roles) spec.roles.emplace(role, token);
  default_roles(spec);
  if (spec.wordpiece) {
    const Reader rc(dir + "/tokenizer_config.json");
    spec.cleanup_spaces = rc.flag(cfg.config, "clean_up_tokenization_spaces", false, "");   // transformers 5's default
  }
  return std::make_shared<HfTokenizer>(std::move(spec));
}

}  // namespace colossal
