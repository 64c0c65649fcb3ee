// HfNameMap: how a family's internal parameter names map to Hugging Face names. Rules are prefix
// rewrites in which "*" stands for a block index: {"blocks.*.attn.qkv", "transformer.h.*.attn.c_attn"}.
// A rule may also say that HF stores the tensor transposed (GPT-2's Conv1D keeps [in, out]) or split
// into parts along dim 0 (OPT keeps q_proj, k_proj and v_proj where we keep one fused qkv), or with
// its rows interleaved per head (BLOOM's query_key_value holds [q_h | k_h | v_h] for each head h
// where our qkv holds all queries, then all keys, then all values). A tensor indexed by input channel
// (a SmoothQuant layer's ".smooth") is the same for every part: it is stored once, whole, under the
// first part's name, and never reordered.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace colossal::nn {

struct HfNameRule {
  std::string ours, hf;
  bool transpose = false;           // 2-D ".weight" tensors are stored transposed under the HF name
  std::vector<std::string> parts;   // non-empty: ours = cat(dim 0) of hf + "." + part, for each part
  int64_t interleave_heads = 0;     // > 0: rows [3, H, D] in ours are [H, 3, D] in HF
};

// Where one of our tensors lives in an HF checkpoint: one name, or one per part (concatenated along
// dim 0 in our layout, each `transpose`d on disk when set).
struct HfTarget {
  std::vector<std::string> names;
  bool transpose = false;
  int64_t interleave_heads = 0;
};

// Which of our tensors an HF tensor belongs to (`hf` is its name with the base prefix restored; the
// layout comes from to_hf(ours)).
struct HfSource {
  std::string ours, hf;
};

class HfNameMap {
 public:
  // `base_prefix` ("model." for OPT) is the prefix transformers drops when a checkpoint was saved from
  // the bare model rather than the LM wrapper (facebook/opt-125m's "decoder.layers.0..."); names
  // without it are read as if they had it.
  HfNameMap(std::vector<HfNameRule> rules, std::vector<std::string> ignored_on_import, std::string base_prefix = "");
  HfTarget to_hf(const std::string& ours) const;                      // Error if no rule matches
  std::optional<HfSource> from_hf(const std::string& hf) const;       // nullopt: ignored or unknown
  bool ignored(const std::string& hf) const;                          // tied heads, buffers HF saves
  // `hf` with the base prefix added where the checkpoint left it out, and LayerNorm's old gamma/beta
  // read as weight/bias.
  std::string canonical(const std::string& hf) const;

 private:
  std::optional<HfSource> match(const std::string& hf) const;
  std::vector<HfNameRule> rules_;
  std::vector<std::string> ignored_;
  std::string base_prefix_;
};

}  // namespace colossal::nn
