// OpenAI's completions API as colossal serve speaks it: the request body of POST /v1/completions parsed
// and checked against the server's limits (every field OpenAI's client libraries send; anything else is
// refused by name), and the JSON of responses, stream chunks and errors. No I/O here, so the fuzz target
// and the tests drive it directly.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace colossal::serve {

// A request the API refuses: the HTTP status and OpenAI's error object fields.
struct ApiError : std::runtime_error {
  ApiError(int status, const std::string& message, std::string param = "", std::string type = "invalid_request_error",
           std::string code = "")
      : std::runtime_error(message), status(status), param(std::move(param)), type(std::move(type)), code(std::move(code)) {}
  int status;
  std::string param, type, code;
};
nlohmann::json error_body(const ApiError& e);   // {"error": {"message", "type", "param", "code"}}

struct ServeLimits {
  int64_t max_body_bytes = 1 << 20;   // larger bodies get 413
  int64_t max_tokens = 1024;          // max_tokens a request may ask for
  int64_t max_choices = 16;           // prompts x n in one request
  int64_t max_queue = 64;             // requests waiting beyond the running batch before 429
};

struct CompletionRequest {
  std::string model;                       // "" when the request names none
  std::vector<std::string> prompts;        // text prompts, or
  std::vector<std::vector<int>> prompt_ids;   // token-id prompts (exactly one of the two is non-empty)
  int64_t max_tokens = 16;                 // OpenAI's default
  double temperature = 1.0;
  double top_p = 1.0;
  std::vector<std::string> stop;
  std::optional<uint64_t> seed;
  int64_t n = 1;
  bool echo = false;
  int64_t logprobs = -1;                   // -1: none; 0..5 alternatives per token
  bool stream = false;
  bool include_usage = false;              // stream_options.include_usage
  size_t prompt_count() const { return prompts.empty() ? prompt_ids.size() : prompts.size(); }
};

// ApiError (400) naming the field and what would be valid; `vocab` bounds token-id prompts.
CompletionRequest parse_completion_request(const std::string& body, const ServeLimits& limits, int64_t vocab);

// One choice's log-probabilities in the completions API's legacy shape.
struct ChoiceLogprobs {
  std::vector<std::string> tokens;
  std::vector<float> token_logprobs;
  std::vector<std::vector<std::pair<std::string, float>>> top;
  std::vector<int64_t> text_offset;
  nlohmann::json to_json() const;
};

}  // namespace colossal::serve
