// Unicode tables and UTF-8: see unicode.h.
#include "src/data/unicode.h"

#include <algorithm>
#include <array>

namespace colossal::unicode {
namespace {

struct ClassRun {
  char32_t first;
  uint8_t cls;
};
template <int W>
struct Mapping {
  char32_t from;
  std::array<char32_t, W> to;   // 0-padded
};

#include "src/data/unicode_tables.inc"

template <int W, size_t N>
const Mapping<W>* find_mapping(const Mapping<W> (&table)[N], char32_t c) {
  const auto* it = std::lower_bound(std::begin(table), std::end(table), c, [](const Mapping<W>& m, char32_t v) { return m.from < v; });
  return it != std::end(table) && it->from == c ? it : nullptr;
}

template <int W>
void append_mapped(std::u32string& out, const Mapping<W>* m, char32_t c) {
  if (!m) {
    out.push_back(c);
    return;
  }
  for (char32_t x : m->to)
    if (x) out.push_back(x);
}

}  // namespace

CharClass char_class(char32_t c) {
  if (c > 0x10FFFF) return CharClass::control;
  const auto* it = std::upper_bound(std::begin(kClassRuns), std::end(kClassRuns), c,
                                    [](char32_t v, const ClassRun& r) { return v < r.first; });
  return static_cast<CharClass>((it - 1)->cls);   // kClassRuns starts at 0, so it > begin
}

bool is_whitespace(char32_t c) {
  switch (c) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x20: case 0x85: case 0xA0: case 0x1680:
    case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

bool is_letter(char32_t c) { return char_class(c) == CharClass::letter; }
bool is_number(char32_t c) { return char_class(c) == CharClass::number; }

bool is_punctuation(char32_t c) {
  if ((c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126)) return true;
  return char_class(c) == CharClass::punctuation;
}

bool is_cjk_ideograph(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B820 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

Decoded decode_at(std::string_view s, size_t i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) return {b0, 1};
  int len;
  char32_t cp, min;
  if ((b0 & 0xE0) == 0xC0) len = 2, cp = b0 & 0x1F, min = 0x80;
  else if ((b0 & 0xF0) == 0xE0) len = 3, cp = b0 & 0x0F, min = 0x800;
  else if ((b0 & 0xF8) == 0xF0) len = 4, cp = b0 & 0x07, min = 0x10000;
  else return {kMalformed, 1};
  if (i + static_cast<size_t>(len) > s.size()) return {kMalformed, 1};
  for (int k = 1; k < len; ++k) {
    const auto b = static_cast<unsigned char>(s[i + static_cast<size_t>(k)]);
    if ((b & 0xC0) != 0x80) return {kMalformed, 1};
    cp = (cp << 6) | (b & 0x3F);
  }
  // Overlong forms, surrogates and values past U+10FFFF are malformed too.
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return {kMalformed, 1};
  return {cp, len};
}

std::u32string decode(std::string_view text) {
  std::u32string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const Decoded d = decode_at(text, i);
    out.push_back(d.cp);
    i += static_cast<size_t>(d.len);
  }
  return out;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

std::string encode(const std::u32string& text) {
  std::string out;
  out.reserve(text.size());
  for (char32_t c : text) append_utf8(out, c);
  return out;
}

void append_lowercase(std::u32string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(c >= 'A' && c <= 'Z' ? c + 32 : c);
    return;
  }
  append_mapped(out, find_mapping(kLowercase, c), c);
}

void append_decomposition(std::u32string& out, char32_t c) {
  constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
  constexpr char32_t kTCount = 28, kNCount = 21 * 28, kSCount = 19 * 21 * 28;
  if (c >= kSBase && c < kSBase + kSCount) {   // Hangul: L V (T), Unicode 3.12
    const char32_t s = c - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount) out.push_back(kTBase + s % kTCount);
    return;
  }
  if (c < 0xC0) {
    out.push_back(c);
    return;
  }
  append_mapped(out, find_mapping(kDecomposition, c), c);
}

}  // namespace colossal::unicode
