// Reading values out of JSON files a user hands us (checkpoint configs, trainer state, safetensors
// headers) without letting nlohmann's own exception text reach them.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace colossal {

// `text` parsed; otherwise an Error "<what> is not valid JSON (syntax error at byte N)" or "(a number
// out of range)" (nlohmann throws out_of_range, not parse_error, for 1e999). `byte_offset` is added
// to the reported byte, for JSON that starts inside a file.
nlohmann::json parse_json(const std::string& text, const std::string& what, uint64_t byte_offset = 0);

// The value as a whole number >= 0, or nullopt. Parsed text stores such numbers as unsigned, a json
// built in memory from int64_t as signed: both count.
std::optional<uint64_t> whole_number(const nlohmann::json& v);

}  // namespace colossal
