// Token sampling: see sampling.h.
#include "src/engine/sampling.h"

#include <ATen/ATen.h>
#include <limits>

namespace colossal {

at::Tensor nucleus_logits(const at::Tensor& logits, double top_p) {
  const int64_t v = logits.size(-1);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  // Each row's probabilities over the whole vocabulary; the candidates are its k largest, in order.
  const at::Tensor log_norm = logits.logsumexp(-1, /*keepdim=*/true);
  for (int64_t k = std::min<int64_t>(v, 256);; k = std::min(v, 4 * k)) {
    auto [top, order] = k == v ? logits.sort(-1, /*descending=*/true) : logits.topk(k, -1);
    const at::Tensor probs = (top - log_norm).exp(), mass = probs.cumsum(-1);
    // Every token past the k-th is dropped once the k candidates hold more than top_p.
    if (k < v && !(mass.select(-1, k - 1) > top_p).all().item<bool>()) continue;
    const at::Tensor kept = top.masked_fill(mass - probs > top_p, neg_inf);   // the mass ahead of each
    return at::full_like(logits, neg_inf).scatter(-1, order, kept);
  }
}

at::Tensor sample_next(const at::Tensor& logits_in, const SamplingConfig& c, at::Generator& gen, int64_t allowed_vocab) {
  at::Tensor logits = logits_in.to(at::kFloat);
  const int64_t v = logits.size(-1);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  if (allowed_vocab < v) logits = logits.clone(), logits.narrow(-1, allowed_vocab, v - allowed_vocab).fill_(neg_inf);
  if (c.greedy || c.temperature <= 0) return logits.argmax(-1);

  // Shifted so the largest logit is 0 before dividing: a tiny temperature (1e-45 is in range) then
  // sends the others to -inf instead of everything to +-inf and the softmax to NaN.
  logits = (logits - std::get<0>(logits.max(-1, /*keepdim=*/true))) / c.temperature;
  if (c.top_k > 0 && c.top_k < v) {
    auto kth = std::get<0>(logits.topk(c.top_k, -1)).narrow(-1, c.top_k - 1, 1);   // [B, 1]
    logits = logits.masked_fill(logits < kth, neg_inf);
  }
  if (c.top_p < 1.0) logits = nucleus_logits(logits, c.top_p);
  auto probs = logits.softmax(-1);
  return at::multinomial(probs, 1, /*replacement=*/false, gen).squeeze(-1);
}

}  // namespace colossal
