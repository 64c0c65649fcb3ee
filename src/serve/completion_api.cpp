// The completions API's request parsing and response shapes: see completion_api.h.
#include "src/serve/completion_api.h"

#include <algorithm>
#include <cmath>

namespace colossal::serve {
namespace {

ApiError bad(const std::string& param, const std::string& message) { return ApiError(400, message, param); }

int64_t whole(const nlohmann::json& v, const std::string& name, int64_t lo, int64_t hi) {
  const std::string range = "from " + std::to_string(lo) + " to " + std::to_string(hi);
  auto out_of_range = [&] { return bad(name, "'" + name + "' must be an integer " + range + " (got " + v.dump() + ")"); };
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(hi) || static_cast<int64_t>(u) < lo) throw out_of_range();
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) {
    const int64_t i = v.get<int64_t>();
    if (i < lo || i > hi) throw out_of_range();
    return i;
  }
  if (v.is_number_float()) {   // 4.0 is 4; the bounds are checked in double before any conversion
    const double d = v.get<double>();
    if (!(d >= static_cast<double>(lo) && d <= static_cast<double>(hi) && d < 9.0e18 && d == std::floor(d))) throw out_of_range();
    return static_cast<int64_t>(d);
  }
  throw out_of_range();
}

double number(const nlohmann::json& v, const std::string& name, double lo, double hi) {
  if (!v.is_number()) throw bad(name, "'" + name + "' must be a number (got " + v.dump() + ")");
  const double d = v.get<double>();
  if (!(d >= lo && d <= hi))
    throw bad(name, "'" + name + "' must be from " + nlohmann::json(lo).dump() + " to " + nlohmann::json(hi).dump() + " (got " + v.dump() + ")");
  return d;
}

bool flag(const nlohmann::json& v, const std::string& name) {
  if (!v.is_boolean()) throw bad(name, "'" + name + "' must be true or false (got " + v.dump() + ")");
  return v.get<bool>();
}

std::vector<int> token_ids(const nlohmann::json& v, int64_t vocab) {
  std::vector<int> ids;
  for (const auto& t : v) ids.push_back(static_cast<int>(whole(t, "prompt", 0, vocab - 1)));
  if (ids.empty()) throw bad("prompt", "a token-id prompt must hold at least one id");
  return ids;
}

void parse_prompt(const nlohmann::json& p, CompletionRequest& r, int64_t vocab) {
  const std::string what = "'prompt' must be a string, an array of strings, an array of token ids or an array of such arrays";
  if (p.is_string()) return r.prompts.push_back(p.get<std::string>());
  if (!p.is_array() || p.empty()) throw bad("prompt", what);
  if (p[0].is_number()) return r.prompt_ids.push_back(token_ids(p, vocab));
  for (const auto& e : p) {
    if (e.is_string() && r.prompt_ids.empty()) r.prompts.push_back(e.get<std::string>());
    else if (e.is_array() && r.prompts.empty()) r.prompt_ids.push_back(token_ids(e, vocab));
    else throw bad("prompt", what);
  }
}

}  // namespace

nlohmann::json error_body(const ApiError& e) {
  return {{"error",
           {{"message", e.what()}, {"type", e.type}, {"param", e.param.empty() ? nlohmann::json() : nlohmann::json(e.param)},
            {"code", e.code.empty() ? nlohmann::json() : nlohmann::json(e.code)}}}};
}

CompletionRequest parse_completion_request(const std::string& body, const ServeLimits& limits, int64_t vocab) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(body);
  } catch (const nlohmann::json::parse_error& e) {
    throw ApiError(400, "the body is not valid JSON (at byte " + std::to_string(e.byte) + ")");
  } catch (const nlohmann::json::exception& e) {   // a number beyond double's range (out_of_range 406), ...
    throw ApiError(400, std::string("the body is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) throw ApiError(400, "the body must be a JSON object, not " + std::string(j.type_name()));
  CompletionRequest r;
  bool has_prompt = false;
  for (const auto& [key, v] : j.items()) {
    if (key == "model") {
      if (!v.is_string()) throw bad("model", "'model' must be a string");
      r.model = v.get<std::string>();
    } else if (key == "prompt") {
      parse_prompt(v, r, vocab), has_prompt = true;
    } else if (key == "max_tokens") {
      if (!v.is_null()) r.max_tokens = whole(v, key, 1, limits.max_tokens);
    } else if (key == "temperature") {
      if (!v.is_null()) r.temperature = number(v, key, 0.0, 2.0);
    } else if (key == "top_p") {
      if (!v.is_null()) r.top_p = number(v, key, 0.0, 1.0);
      if (r.top_p == 0.0) throw bad(key, "'top_p' must be above 0 (use temperature 0 for greedy decoding)");
    } else if (key == "stop") {
      if (v.is_string()) r.stop = {v.get<std::string>()};
      else if (v.is_array() && v.size() <= 4 && std::all_of(v.begin(), v.end(), [](const auto& s) { return s.is_string(); }))
        for (const auto& s : v) r.stop.push_back(s.get<std::string>());
      else if (!v.is_null()) throw bad(key, "'stop' must be a string or an array of at most 4 strings");
    } else if (key == "seed") {
      if (!v.is_null()) r.seed = static_cast<uint64_t>(whole(v, key, 0, INT64_MAX));
    } else if (key == "n") {
      if (!v.is_null()) r.n = whole(v, key, 1, limits.max_choices);
    } else if (key == "echo") {
      r.echo = v.is_null() ? false : flag(v, key);
    } else if (key == "logprobs") {
      if (!v.is_null()) r.logprobs = whole(v, key, 0, 5);
    } else if (key == "stream") {
      r.stream = v.is_null() ? false : flag(v, key);
    } else if (key == "stream_options") {
      if (v.is_null()) continue;
      if (!v.is_object()) throw bad(key, "'stream_options' must be an object");
      for (const auto& [k2, v2] : v.items()) {
        if (k2 != "include_usage") throw bad(key, "'stream_options." + k2 + "' is not supported (valid: include_usage)");
        r.include_usage = flag(v2, "stream_options.include_usage");
      }
    } else if (key == "best_of") {
      if (!v.is_null() && whole(v, key, 1, 1) != 1) throw bad(key, "'best_of' other than 1 is not supported");
    } else if (key == "presence_penalty" || key == "frequency_penalty") {
      if (!v.is_null() && number(v, key, -2.0, 2.0) != 0.0) throw bad(key, "'" + key + "' other than 0 is not supported");
    } else if (key == "logit_bias") {
      if (!v.is_null() && !(v.is_object() && v.empty())) throw bad(key, "'logit_bias' is not supported");
    } else if (key == "suffix") {
      if (!v.is_null()) throw bad(key, "'suffix' is not supported");
    } else if (key == "user") {
      if (!v.is_string() && !v.is_null()) throw bad(key, "'user' must be a string");
    } else {
      throw bad(key, "unrecognized request argument '" + key + "'");
    }
  }
  if (!has_prompt) throw bad("prompt", "'prompt' is required");
  if (static_cast<int64_t>(r.prompt_count()) * r.n > limits.max_choices)
    throw bad("n", std::to_string(r.prompt_count()) + " prompts x n = " + std::to_string(r.n) + " asks for " +
                       std::to_string(static_cast<int64_t>(r.prompt_count()) * r.n) + " completions; this server allows " +
                       std::to_string(limits.max_choices) + " a request");
  if (!r.stream && r.include_usage) throw bad("stream_options", "'stream_options' needs 'stream': true");
  return r;
}

nlohmann::json ChoiceLogprobs::to_json() const {
  nlohmann::json top_json = nlohmann::json::array();
  for (const auto& alternatives : top) {
    nlohmann::json o = nlohmann::json::object();
    for (const auto& [t, lp] : alternatives) o[t] = lp;
    top_json.push_back(o);
  }
  return {{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top_json}, {"text_offset", text_offset}};
}

}  // namespace colossal::serve
