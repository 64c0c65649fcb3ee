// Fuzz target: the body of POST /v1/completions as colossal serve parses it. Every input is either a
// request within the limits or an ApiError (the 4xx a client gets); any other exception escaping the
// parser (a JSON library's type error, a bad conversion) would reach the server's 500 handler instead.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "src/serve/completion_api.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const colossal::serve::ServeLimits limits{.max_body_bytes = 1 << 20, .max_tokens = 64, .max_choices = 8, .max_queue = 4};
  try {
    const auto r = colossal::serve::parse_completion_request(std::string(reinterpret_cast<const char*>(data), size), limits, 512);
    const bool ok = r.max_tokens >= 1 && r.max_tokens <= 64 && r.n >= 1 && static_cast<int64_t>(r.prompt_count()) * r.n <= 8 &&
                    r.prompt_count() >= 1 && (r.prompts.empty() != r.prompt_ids.empty()) && r.logprobs <= 5;
    for (const auto& ids : r.prompt_ids)
      for (int id : ids)
        if (id < 0 || id >= 512) std::abort();
    if (!ok) {
      std::fprintf(stderr, "fuzz: a request outside the limits was accepted\n");
      std::abort();
    }
  } catch (const colossal::serve::ApiError& e) {
    if (e.status < 400 || e.status > 499) std::abort();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz: an exception other than ApiError escaped: %s\n", e.what());
    std::abort();
  }
  return 0;
}
