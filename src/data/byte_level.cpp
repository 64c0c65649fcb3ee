// Byte-level alphabet and GPT-2's word split: see byte_level.h.
#include "src/data/byte_level.h"

#include <array>
#include <unordered_map>

#include "src/data/unicode.h"

namespace colossal::byte_level {
namespace {

// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68 take the code
// points from U+0100 upwards in byte order.
struct Alphabet {
  std::array<std::string, 256> of_byte;
  std::unordered_map<char32_t, unsigned char> byte_of;
  Alphabet() {
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      const char32_t c = printable ? static_cast<char32_t>(b) : next++;
      unicode::append_utf8(of_byte[static_cast<size_t>(b)], c);
      byte_of[c] = static_cast<unsigned char>(b);
    }
  }
};

const Alphabet& alphabet() {
  static const Alphabet a;
  return a;
}

}  // namespace

const std::string& char_of(unsigned char byte) { return alphabet().of_byte[byte]; }

std::string encode(std::string_view text) {
  std::string out;
  out.reserve(text.size() * 2);
  for (unsigned char b : text) out += alphabet().of_byte[b];
  return out;
}

std::string decode_token(std::string_view token) {
  std::string bytes;
  bytes.reserve(token.size());
  const auto& byte_of = alphabet().byte_of;
  for (size_t i = 0; i < token.size();) {
    const auto d = unicode::decode_at(token, i);
    const auto it = d.cp == unicode::kMalformed ? byte_of.end() : byte_of.find(d.cp);
    if (it == byte_of.end()) return std::string(token);   // not byte-level text: the token as written
    bytes.push_back(static_cast<char>(it->second));
    i += static_cast<size_t>(d.len);
  }
  return bytes;
}

std::vector<std::string_view> split_words(std::string_view text) {
  struct Char {
    char32_t cp;
    size_t at;   // byte offset in text
  };
  std::vector<Char> cs;
  cs.reserve(text.size() + 1);
  for (size_t i = 0; i < text.size();) {
    const auto d = unicode::decode_at(text, i);
    cs.push_back({d.cp, i});
    i += static_cast<size_t>(d.len);
  }
  const size_t n = cs.size();
  cs.push_back({0, text.size()});   // sentinel: the byte offset of the end
  auto is_space = [&](size_t i) { return i < n && unicode::is_whitespace(cs[i].cp); };
  auto is_letter = [&](size_t i) { return i < n && unicode::is_letter(cs[i].cp); };
  auto is_number = [&](size_t i) { return i < n && unicode::is_number(cs[i].cp); };
  auto is_symbol = [&](size_t i) { return i < n && !is_space(i) && !is_letter(i) && !is_number(i); };
  auto ascii_at = [&](size_t i, char c) { return i < n && cs[i].cp == static_cast<char32_t>(c); };

  std::vector<std::string_view> words;
  size_t i = 0;
  while (i < n) {
    size_t end = i;
    if (ascii_at(i, '\'')) {   // 's 't 're 've 'm 'll 'd (ASCII, case-sensitive)
      if (ascii_at(i + 1, 's') || ascii_at(i + 1, 't') || ascii_at(i + 1, 'm') || ascii_at(i + 1, 'd')) end = i + 2;
      else if ((ascii_at(i + 1, 'r') && ascii_at(i + 2, 'e')) || (ascii_at(i + 1, 'v') && ascii_at(i + 2, 'e')) ||
               (ascii_at(i + 1, 'l') && ascii_at(i + 2, 'l')))
        end = i + 3;
    }
    if (end == i) {
      // " ?X+" for X = letters, numbers, other symbols: an optional leading ASCII space, then a run.
      const size_t j = ascii_at(i, ' ') ? i + 1 : i;
      if (is_letter(j)) {
        end = j;
        while (is_letter(end)) ++end;
      } else if (is_number(j)) {
        end = j;
        while (is_number(end)) ++end;
      } else if (is_symbol(j)) {
        end = j;
        while (is_symbol(end)) ++end;
      }
    }
    if (end == i) {
      // A whitespace run: all of it at the end of the text, else all but its last character (which
      // then leads the next word), else its one character.
      size_t run = i;
      while (is_space(run)) ++run;
      end = run == n || run - i == 1 ? run : run - 1;
    }
    words.push_back(text.substr(cs[i].at, cs[end].at - cs[i].at));
    i = end;
  }
  return words;
}

std::vector<std::string_view> split_bloom_words(std::string_view text) {
  auto word_char = [](char32_t c) {
    switch (c) {
      case '(': case ')': case '|': case '.': case ',': case '!': case '?':
      case U'…': case U'。': case U'，': case U'、': case U'।': case U'۔': case U'،':
        return false;
      default:
        return !unicode::is_whitespace(c);
    }
  };
  std::vector<std::string_view> words;
  size_t gap = 0;   // start of the unmatched text before the next match
  for (size_t i = 0; i < text.size();) {
    const auto d = unicode::decode_at(text, i);
    const size_t next = i + static_cast<size_t>(d.len);
    const bool starts = word_char(d.cp) || (d.cp == ' ' && next < text.size() && word_char(unicode::decode_at(text, next).cp));
    if (!starts) {
      i = next;
      continue;
    }
    if (i > gap) words.push_back(text.substr(gap, i - gap));
    size_t end = d.cp == ' ' ? next : i;
    while (end < text.size()) {
      const auto e = unicode::decode_at(text, end);
      if (!word_char(e.cp)) break;
      end += static_cast<size_t>(e.len);
    }
    words.push_back(text.substr(i, end - i));
    gap = i = end;
  }
  if (gap < text.size()) words.push_back(text.substr(gap));
  return words;
}

}  // namespace colossal::byte_level
