// BERT normalizer, pre-tokenizer and WordPiece: see wordpiece.h.
#include "src/data/wordpiece.h"

#include "src/core/error.h"
#include "src/data/unicode.h"

namespace colossal {

std::string BertNormalizer::apply(std::string_view text) const {
  std::u32string in = unicode::decode(text), out;
  out.reserve(in.size());
  auto stage = [&](auto&& per_char) {
    out.clear();
    for (char32_t c : in) per_char(c);
    std::swap(in, out);
  };
  if (clean_text)
    stage([&](char32_t c) {
      if (c == '\t' || c == '\n' || c == '\r') return out.push_back(' ');
      if (c == 0 || c == 0xFFFD || unicode::char_class(c) == unicode::CharClass::control) return;
      out.push_back(unicode::is_whitespace(c) ? U' ' : c);
    });
  if (handle_chinese_chars)
    stage([&](char32_t c) {
      if (!unicode::is_cjk_ideograph(c)) return out.push_back(c);
      out.push_back(' ');
      out.push_back(c);
      out.push_back(' ');
    });
  if (strip_accents.value_or(lowercase))
    stage([&](char32_t c) {
      std::u32string parts;
      unicode::append_decomposition(parts, c);
      for (char32_t p : parts)
        if (unicode::char_class(p) != unicode::CharClass::nonspacing_mark) out.push_back(p);
    });
  if (lowercase) stage([&](char32_t c) { unicode::append_lowercase(out, c); });
  return unicode::encode(in);
}

std::vector<std::string_view> bert_words(std::string_view text) {
  std::vector<std::string_view> words;
  size_t start = 0;
  auto flush = [&](size_t end) {
    if (end > start) words.push_back(text.substr(start, end - start));
  };
  for (size_t i = 0; i < text.size();) {
    const auto d = unicode::decode_at(text, i);
    const size_t next = i + static_cast<size_t>(d.len);
    if (unicode::is_whitespace(d.cp)) {
      flush(i);
      start = next;
    } else if (unicode::is_punctuation(d.cp)) {
      flush(i);
      words.push_back(text.substr(i, next - i));
      start = next;
    }
    i = next;
  }
  flush(text.size());
  return words;
}

WordPieceModel::WordPieceModel(std::unordered_map<std::string, int> vocab, std::string unk_token, std::string prefix,
                               int64_t max_input_chars_per_word, const std::string& where)
    : vocab_(std::move(vocab), where), prefix_(std::move(prefix)), max_chars_(max_input_chars_per_word) {
  auto unk = vocab_.id_of(unk_token);
  if (!unk) throw Error(where + ": the unknown token \"" + unk_token + "\" is not in the vocabulary");
  unk_ = *unk;
}

void WordPieceModel::encode_word(std::string_view word, std::vector<int>& out) const {
  std::vector<size_t> bounds;   // byte offsets of the word's characters, and its end
  for (size_t i = 0; i < word.size(); i += static_cast<size_t>(unicode::decode_at(word, i).len)) bounds.push_back(i);
  if (static_cast<int64_t>(bounds.size()) > max_chars_) return out.push_back(unk_);
  bounds.push_back(word.size());
  std::vector<int> pieces;
  std::string key;
  for (size_t start = 0; start + 1 < bounds.size();) {
    size_t end = bounds.size() - 1;
    int found = -1;
    for (; end > start; --end) {
      key.assign(start > 0 ? prefix_ : std::string());
      key.append(word.substr(bounds[start], bounds[end] - bounds[start]));
      if (auto id = vocab_.id_of(key)) {
        found = *id;
        break;
      }
    }
    if (found < 0) return out.push_back(unk_);   // one piece missing: the whole word is unknown
    pieces.push_back(found);
    start = end;
  }
  out.insert(out.end(), pieces.begin(), pieces.end());
}

std::string cleanup_tokenization_spaces(std::string text) {
  for (auto [from, to] : {std::pair{" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"}, {" n't", "n't"}, {" 'm", "'m"},
                          {" do not", " don't"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}}) {
    const std::string f(from), r(to);
    for (size_t pos = 0; (pos = text.find(f, pos)) != std::string::npos; pos += r.size()) text.replace(pos, f.size(), r);
  }
  return text;
}

std::string wordpiece_join(const std::vector<std::string>& tokens, const std::string& prefix, bool cleanup) {
  std::string text;
  for (size_t i = 0; i < tokens.size(); ++i) {
    std::string t = tokens[i];
    if (i > 0) t = !prefix.empty() && t.starts_with(prefix) ? t.substr(prefix.size()) : " " + t;
    text += cleanup ? cleanup_tokenization_spaces(std::move(t)) : t;
  }
  return text;
}

}  // namespace colossal
