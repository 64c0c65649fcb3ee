// Next-token selection from logits: greedy, or temperature / top-k / top-p (nucleus) sampling with
// an explicit generator so a seed reproduces the output exactly.
#pragma once
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <cstdint>
#include <string>
#include <vector>

namespace colossal {

struct SamplingConfig {
  bool greedy = false;
  double temperature = 0.8;
  int64_t top_k = 0;        // 0 = off
  double top_p = 1.0;       // 1 = off
  uint64_t seed = 1234;
  int64_t max_tokens = 128;
  std::vector<std::string> stop;   // generation ends when the text contains one (it is not emitted)
};

// logits [B, V] -> ids [B] (int64). Ids >= `allowed_vocab` (model padding rows) are never chosen.
at::Tensor sample_next(const at::Tensor& logits, const SamplingConfig& config, at::Generator& generator,
                       int64_t allowed_vocab);

}  // namespace colossal
