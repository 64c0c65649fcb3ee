// HfNameMap: how a family's internal parameter names map to Hugging Face names, and which weights
// HF stores transposed (GPT-2's Conv1D keeps [in, out]). Rules are prefix rewrites in which "*"
// stands for a block index: {"blocks.*.attn.qkv", "transformer.h.*.attn.c_attn", transpose}.
#pragma once
#include <optional>
#include <string>
#include <vector>

namespace colossal::nn {

struct HfNameRule {
  std::string ours, hf;
  bool transpose = false;   // 2-D ".weight" tensors are stored transposed under the HF name
};

struct HfName {
  std::string name;
  bool transpose = false;
};

class HfNameMap {
 public:
  HfNameMap(std::vector<HfNameRule> rules, std::vector<std::string> ignored_on_import);
  HfName to_hf(const std::string& ours) const;                        // Error if no rule matches
  std::optional<HfName> from_hf(const std::string& hf) const;         // nullopt: ignored or unknown
  bool ignored(const std::string& hf) const;                          // tied heads, buffers HF saves

 private:
  std::vector<HfNameRule> rules_;
  std::vector<std::string> ignored_;
};

}  // namespace colossal::nn
