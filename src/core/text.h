// Small text helpers shared by error messages and reports: edit distance for "did you mean",
// human-readable sizes and durations.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace colossal {

size_t edit_distance(const std::string& a, const std::string& b);
// The candidate nearest to `word`, or "" if none is close enough to be a plausible typo.
std::string nearest_name(const std::string& word, const std::vector<std::string>& candidates);
std::string human_bytes(double bytes);          // "1.50 GiB"
std::string human_count(double n);              // "124.4M"
std::string human_duration(double seconds);     // "1:02:03" or "02:03"
std::string join(const std::vector<std::string>& parts, const std::string& sep);
// A number for messages: up to 6 significant digits, so 1e308 stays "1e+308" (not 309 digits).
std::string format_number(double x);
// The offset of the first byte that does not belong to a well-formed UTF-8 sequence, or npos.
size_t invalid_utf8_at(const std::string& text);
// The offset of the first control character (below 0x20, or DEL), or npos.
size_t control_char_at(const std::string& text);
// A whole number written in decimal digits only (no sign, space or exponent) that fits 64 bits.
std::optional<uint64_t> parse_whole(const std::string& text);

}  // namespace colossal
