// Masked-LM batches: see mlm_masking.h.
#include "src/data/mlm_masking.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

namespace colossal {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

uint64_t batch_seed(uint64_t seed, uint64_t a, uint64_t b) { return splitmix64(splitmix64(splitmix64(seed) ^ a) ^ b); }

MaskedBatch mask_tokens(const at::Tensor& windows, const MlmSpec& spec, uint64_t seed) {
  TORCH_CHECK(windows.dim() == 2 && windows.scalar_type() == at::kLong, "mask_tokens: windows must be [B, L] int64");
  const int64_t b = windows.size(0);
  const auto opts = windows.options();
  at::Tensor inputs = at::cat({at::full({b, 1}, spec.cls, opts), windows, at::full({b, 1}, spec.sep, opts)}, 1);   // [B, L+2]
  at::Tensor special = at::zeros_like(inputs, at::kBool);
  for (int id : spec.specials) special |= inputs.eq(id);
  special |= inputs.eq(spec.cls) | inputs.eq(spec.sep);

  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::Tensor chosen = at::rand(inputs.sizes(), gen, at::TensorOptions().dtype(at::kFloat)).lt(spec.probability) & special.logical_not();
  if (!chosen.any().item<bool>()) {   // a tiny batch may draw none; the loss needs one
    const at::Tensor candidates = special.logical_not().view({-1}).nonzero();
    if (candidates.numel() > 0) chosen.view({-1})[candidates[0][0]] = true;
  }
  at::Tensor labels = at::where(chosen, inputs, at::full_like(inputs, -100));
  const at::Tensor draw = at::rand(inputs.sizes(), gen, at::TensorOptions().dtype(at::kFloat));   // 80 / 10 / 10
  const at::Tensor to_mask = chosen & draw.lt(0.8);
  const at::Tensor to_random = chosen & draw.ge(0.8) & draw.lt(0.9);
  const at::Tensor random_ids = at::randint(0, spec.vocab_size, inputs.sizes(), gen, opts);
  inputs = at::where(to_mask, at::full_like(inputs, spec.mask), inputs);
  inputs = at::where(to_random, random_ids, inputs);
  return {inputs, labels};
}

}  // namespace colossal
