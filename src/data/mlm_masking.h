// Masked-LM batches, as BERT was pretrained: each window of text tokens is wrapped as
// [CLS] tokens [SEP], and 15% of the non-special positions are chosen to be predicted; of those, 80%
// become [MASK], 10% a random token and 10% stay as they are (transformers'
// DataCollatorForLanguageModeling). The draws come from a generator seeded by the caller, so a batch
// is the same for the same seed whatever ran before it (resume and data parallelism stay exact).
#pragma once
#include <ATen/core/Tensor.h>
#include <cstdint>
#include <vector>

namespace colossal {

struct MlmSpec {
  int cls = -1, sep = -1, mask = -1;
  std::vector<int> specials;   // never chosen (cls, sep, pad, the document separator, ...)
  int64_t vocab_size = 0;      // random replacements are drawn from [0, vocab_size)
  double probability = 0.15;
};

struct MaskedBatch {
  at::Tensor inputs;   // [B, L + 2] int64: [CLS] window [SEP] with the chosen positions replaced
  at::Tensor labels;   // [B, L + 2] int64: the original token where chosen, -100 elsewhere
};

// windows [B, L] int64 of text tokens. At least one position of the batch is chosen.
MaskedBatch mask_tokens(const at::Tensor& windows, const MlmSpec& spec, uint64_t seed);

// A seed for one batch from the run's seed and what identifies the batch (its global sample
// position, the rank), mixed so nearby inputs give unrelated streams.
uint64_t batch_seed(uint64_t seed, uint64_t a, uint64_t b);

}  // namespace colossal
