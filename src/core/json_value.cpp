// JSON values from user files: see json_value.h.
#include "src/core/json_value.h"

#include "src/core/error.h"

namespace colossal {

nlohmann::json parse_json(const std::string& text, const std::string& what, uint64_t byte_offset) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(what + " is not valid JSON (syntax error at byte " + std::to_string(byte_offset + e.byte) + ")");
  } catch (const nlohmann::json::exception&) {   // out_of_range: a number like 1e999 (found by tests/fuzz)
    throw Error(what + " is not valid JSON (a number out of range)");
  }
}

std::optional<uint64_t> whole_number(const nlohmann::json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return static_cast<uint64_t>(v.get<int64_t>());
  return std::nullopt;
}

}  // namespace colossal
