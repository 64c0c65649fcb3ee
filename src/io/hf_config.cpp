// HF config.json reads: see hf_config.h.
#include "src/io/hf_config.h"

#include <limits>

#include "src/core/error.h"
#include "src/core/json_value.h"
#include "src/core/text.h"

namespace colossal {

HfConfigReader::HfConfigReader(const nlohmann::json& j, std::string path, const std::string& model_type, std::string label)
    : j_(j), path_(std::move(path)), label_(std::move(label)) {
  if (!j.is_object()) fail("holds " + std::string(j.type_name()) + ", not a JSON object");
  if (j.contains("model_type") && !j["model_type"].is_string())
    fail("\"model_type\" = " + j["model_type"].dump() + " is not a name");
  const std::string type = j.value("model_type", model_type);
  if (type != model_type) fail("model_type \"" + type + "\" is not " + model_type);
}

void HfConfigReader::fail(const std::string& message) const { throw Error(path_ + ": " + message); }

bool HfConfigReader::present(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }

int64_t HfConfigReader::size(const char* key, int64_t max) const {
  if (!present(key)) fail("missing \"" + std::string(key) + "\" (not a " + label_ + " config.json?)");
  return size(key, 0, max);
}

int64_t HfConfigReader::size(const char* key, int64_t fallback, int64_t max) const {
  if (!present(key)) return fallback;
  const auto n = whole_number(j_[key]);
  if (!n || *n < 1 || *n > static_cast<uint64_t>(max))
    fail("\"" + std::string(key) + "\" = " + j_[key].dump() + " (expected a whole number in [1, " + std::to_string(max) + "])");
  return static_cast<int64_t>(*n);
}

int64_t HfConfigReader::index(const char* key, int64_t fallback, int64_t max) const {
  if (!present(key)) return fallback;
  const auto n = whole_number(j_[key]);
  if (!n || *n > static_cast<uint64_t>(max))
    fail("\"" + std::string(key) + "\" = " + j_[key].dump() + " (expected a whole number in [0, " + std::to_string(max) + "])");
  return static_cast<int64_t>(*n);
}

double HfConfigReader::real(const char* key, double fallback, double lo, double hi, bool open_lo) const {
  if (!present(key)) return fallback;
  const auto& v = j_[key];
  const double x = v.is_number() ? v.get<double>() : std::numeric_limits<double>::quiet_NaN();
  if (!(open_lo ? x > lo : x >= lo) || !(x < hi))
    fail("\"" + std::string(key) + "\" = " + v.dump() + " (expected a number in " + (open_lo ? "(" : "[") + format_number(lo) +
         ", " + format_number(hi) + "))");
  return x;
}

bool HfConfigReader::flag(const char* key, bool fallback) const {
  if (!present(key)) return fallback;
  if (!j_[key].is_boolean()) fail("\"" + std::string(key) + "\" = " + j_[key].dump() + " (expected true or false)");
  return j_[key].get<bool>();
}

std::string HfConfigReader::choice(const char* key, const std::string& fallback, const std::vector<std::string>& choices) const {
  if (!present(key)) return fallback;
  for (const auto& c : choices)
    if (j_[key] == c) return c;
  fail("\"" + std::string(key) + "\" = " + j_[key].dump() + " is not supported (valid: " + join(choices, ", ") + ")");
}

std::string HfConfigReader::first_choice(const char* key, const std::string& fallback, const std::vector<std::string>& choices) const {
  if (!present(key)) return fallback;
  const auto& v = j_[key];
  if (!v.is_array() || v.empty()) fail("\"" + std::string(key) + "\" = " + v.dump() + " (expected a list of names)");
  for (const auto& c : choices)
    if (v[0] == c) return c;
  fail("\"" + std::string(key) + "\" = " + v.dump() + " is not supported (valid: " + join(choices, ", ") + ")");
}

nlohmann::json HfConfigReader::id2label() const {
  if (!present("id2label")) return nullptr;
  const auto& m = j_["id2label"];
  if (!m.is_object()) fail("\"id2label\" = " + m.dump() + " (expected an object of class indices to names)");
  for (const auto& [id, label] : m.items())
    if (!label.is_string() || id.empty() || id.size() > 9 || id.find_first_not_of("0123456789") != std::string::npos)
      fail("\"id2label\" maps \"" + id + "\" to " + label.dump() + " (expected class indices to names)");
  return m.empty() ? nlohmann::json() : m;
}

void write_labels(nlohmann::json& config, const nlohmann::json& id2label, int64_t num_labels) {
  nlohmann::json ids = id2label, names = nlohmann::json::object();
  if (!ids.is_object() || static_cast<int64_t>(ids.size()) != num_labels) {
    ids = nlohmann::json::object();
    for (int64_t i = 0; i < num_labels; ++i) ids[std::to_string(i)] = "LABEL_" + std::to_string(i);
  }
  for (const auto& [id, label] : ids.items()) names[label.get<std::string>()] = std::stoll(id);
  config["id2label"] = ids;
  config["label2id"] = names;
}

void HfConfigReader::fixed(const char* key, const std::vector<nlohmann::json>& accepted, const std::string& supported) const {
  if (!present(key)) return;
  for (const auto& a : accepted)
    if (j_[key] == a) return;
  fail("\"" + std::string(key) + "\" = " + j_[key].dump() + " is not supported (" + supported + ")");
}

}  // namespace colossal
