// GPT-2's byte-level text handling, as Hugging Face's ByteLevel pre-tokenizer and decoder do it:
// every byte is shown as one printable character (so BPE vocabularies hold no raw bytes or spaces:
// ' ' is 'Ġ'), and text is first cut into words by GPT-2's pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// implemented here as a scanner over code points (no regex engine has \p{L} in the C++ library).
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace colossal::byte_level {

// The byte's printable stand-in, UTF-8 encoded (a vocabulary key).
const std::string& char_of(unsigned char byte);
// `text` with each byte replaced by its stand-in.
std::string encode(std::string_view text);
// The bytes a vocabulary token stands for; a token holding any character outside the 256 stand-ins
// (an added token such as "<|endoftext|>" holds none, but "<ñ>" would) is its own UTF-8 bytes.
std::string decode_token(std::string_view token);

// Cuts `text` into GPT-2's words, as byte ranges of `text` (views into it). Malformed UTF-8 bytes
// are words' characters like any symbol, so the words always cover the text exactly.
std::vector<std::string_view> split_words(std::string_view text);

// BLOOM's word pattern, the Split pre-tokenizer its tokenizer.json runs before ByteLevel:
//   " ?[^(\s|[.,!?…。，、।۔،])]+" with behaviour Isolated
// (Oniguruma's nested class: anything but whitespace, "(", ")", "|" and those eleven marks). Each
// match is a word, and so is each run of text between matches.
inline constexpr const char* kBloomSplitPattern = " ?[^(\\s|[.,!?…。，、।۔،])]+";
std::vector<std::string_view> split_bloom_words(std::string_view text);

}  // namespace colossal::byte_level
