// Unicode facts the tokenizers need and nothing more: UTF-8 decoding that never fails (a malformed
// byte is one character of its own, so byte-level tokenizers still round-trip it), the character
// classes Hugging Face's pre-tokenizers and normalizers test (letter, number, punctuation, nonspacing
// mark, control, White_Space), per-character lowercasing and canonical decomposition. Tables are
// generated from Python's unicodedata by scripts/fixtures/make_unicode_tables.py.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace colossal::unicode {

enum class CharClass : uint8_t { other, letter, number, punctuation, nonspacing_mark, control };

// General category, folded: L*, N*, P*, Mn, C* (control, format, unassigned, private use, surrogate).
CharClass char_class(char32_t c);
bool is_whitespace(char32_t c);   // the White_Space property (Rust's char::is_whitespace, regex \s)
bool is_letter(char32_t c);
bool is_number(char32_t c);
bool is_punctuation(char32_t c);   // P* or ASCII punctuation (BERT counts $, +, <, =, >, ^, `, | and ~ too)
bool is_cjk_ideograph(char32_t c);   // the blocks BERT pads with spaces

constexpr char32_t kMalformed = 0xFFFD;

// One character of `text` at byte `i` (i < text.size()). A malformed or truncated sequence decodes as
// kMalformed with length 1, so every byte of the input belongs to exactly one character.
struct Decoded {
  char32_t cp;
  int len;
};
Decoded decode_at(std::string_view text, size_t i);
std::u32string decode(std::string_view text);
void append_utf8(std::string& out, char32_t c);
std::string encode(const std::u32string& text);

// Appends c's full lowercase mapping (one or more characters; Rust's char::to_lowercase).
void append_lowercase(std::u32string& out, char32_t c);
// Appends c's canonical decomposition (NFD of one character; Hangul syllables by formula).
void append_decomposition(std::u32string& out, char32_t c);

}  // namespace colossal::unicode
