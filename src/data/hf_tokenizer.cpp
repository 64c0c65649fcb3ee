// Hugging Face's tokenization pipeline: see hf_tokenizer.h.
#include "src/data/hf_tokenizer.h"

#include <algorithm>

#include "src/data/byte_level.h"
#include "src/data/unicode.h"

namespace colossal {
namespace {

bool is_word_char(char32_t c) { return c == '_' || unicode::is_letter(c) || unicode::is_number(c); }

// The character ending just before byte `end` of `s` (end > 0); a malformed byte is one character.
unicode::Decoded decoded_before(std::string_view s, size_t end) {
  for (size_t back = 2; back <= 4 && back <= end; ++back) {
    const auto d = unicode::decode_at(s, end - back);
    if (static_cast<size_t>(d.len) == back) return d;
  }
  return {unicode::decode_at(s, end - 1).cp, 1};
}
char32_t char_before(std::string_view s, size_t end) { return decoded_before(s, end).cp; }

}  // namespace

HfTokenizer::HfTokenizer(HfTokenizerSpec spec) : spec_(std::move(spec)), added_by_first_byte_(256) {
  for (const auto& t : spec_.added) {
    added_by_id_[t.id] = &t;
    if (!t.content.empty()) added_by_first_byte_[static_cast<unsigned char>(t.content[0])].push_back(&t);
  }
  for (auto& list : added_by_first_byte_)
    std::stable_sort(list.begin(), list.end(), [](const AddedToken* a, const AddedToken* b) { return a->content.size() > b->content.size(); });
}

void HfTokenizer::encode_plain(std::string_view text, std::vector<int>& out) const {
  if (text.empty()) return;
  std::string normalized;
  if (spec_.normalizer) {
    normalized = spec_.normalizer->apply(text);
    text = normalized;
  }
  if (spec_.wordpiece) {
    for (auto word : bert_words(text)) spec_.wordpiece->encode_word(word, out);
    return;
  }
  std::string prefixed;
  if (spec_.add_prefix_space && text[0] != ' ') {
    prefixed.reserve(text.size() + 1);
    prefixed.push_back(' ');
    prefixed.append(text);
    text = prefixed;
  }
  const auto words = spec_.bloom_split ? byte_level::split_bloom_words(text)
                     : spec_.use_regex  ? byte_level::split_words(text)
                                        : std::vector<std::string_view>{text};
  for (auto word : words) spec_.bpe->encode_word(byte_level::encode(word), out);
}

std::vector<int> HfTokenizer::encode(std::string_view text, bool add_special) const {
  std::vector<int> ids;
  if (add_special) ids = spec_.template_before;
  // Added tokens first, leftmost-longest; the text between them goes through the pipeline.
  size_t plain_from = 0;
  for (size_t i = 0; i < text.size();) {
    const AddedToken* hit = nullptr;
    for (const AddedToken* t : added_by_first_byte_[static_cast<unsigned char>(text[i])]) {
      if (text.compare(i, t->content.size(), t->content) != 0) continue;
      const size_t end = i + t->content.size();
      if (t->single_word && ((i > 0 && is_word_char(char_before(text, i))) ||
                             (end < text.size() && is_word_char(unicode::decode_at(text, end).cp))))
        continue;
      hit = t;
      break;
    }
    if (!hit) {
      ++i;
      continue;
    }
    size_t start = i, end = i + hit->content.size();
    if (hit->lstrip)
      for (auto d = unicode::Decoded{}; start > plain_from && unicode::is_whitespace((d = decoded_before(text, start)).cp);)
        start -= static_cast<size_t>(d.len);
    if (hit->rstrip)
      while (end < text.size() && unicode::is_whitespace(unicode::decode_at(text, end).cp)) end += static_cast<size_t>(unicode::decode_at(text, end).len);
    encode_plain(text.substr(plain_from, start - plain_from), ids);
    ids.push_back(hit->id);
    plain_from = i = end;
  }
  encode_plain(text.substr(plain_from), ids);
  if (add_special) ids.insert(ids.end(), spec_.template_after.begin(), spec_.template_after.end());
  return ids;
}

const std::string* HfTokenizer::token_of(int id) const {
  if (auto it = added_by_id_.find(id); it != added_by_id_.end()) return &it->second->content;
  return vocab().token_of(id);
}

std::string HfTokenizer::decode(const std::vector<int>& ids, bool skip_special) const {
  std::vector<std::string> tokens;
  for (int id : ids) {
    auto added = added_by_id_.find(id);
    if (skip_special && added != added_by_id_.end() && added->second->special) continue;
    if (const std::string* t = token_of(id)) tokens.push_back(*t);   // ids outside the vocabulary are skipped, as HF does
  }
  if (spec_.bpe) {
    std::string bytes;
    for (const auto& t : tokens) bytes += byte_level::decode_token(t);
    return bytes;
  }
  std::string text = wordpiece_join(tokens, spec_.wordpiece->prefix(), spec_.wordpiece_cleanup);
  return spec_.cleanup_spaces ? cleanup_tokenization_spaces(std::move(text)) : text;
}

int64_t HfTokenizer::vocab_size() const {
  int64_t n = vocab().end_id();
  for (const auto& t : spec_.added) n = std::max<int64_t>(n, int64_t{t.id} + 1);
  return n;
}

std::optional<int> HfTokenizer::id_of(std::string_view token) const {
  for (const auto& t : spec_.added)
    if (t.content == token) return t.id;
  return vocab().id_of(token);
}

std::optional<int> HfTokenizer::role_id(const std::string& role) const {
  auto it = spec_.roles.find(role);
  if (it == spec_.roles.end()) return std::nullopt;
  return id_of(it->second);
}

}  // namespace colossal
