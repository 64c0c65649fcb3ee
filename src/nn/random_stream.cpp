// A rank's own random stream: see random_stream.h.
#include "src/nn/random_stream.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

namespace colossal::nn {

RandomStream::RandomStream(uint64_t seed) : generator_(at::make_generator<at::CPUGeneratorImpl>(seed)) {}

at::Tensor RandomStream::keep_mask(at::IntArrayRef shape, double p, const c10::Device& device) {
  std::lock_guard<std::mutex> lock(mu_);
  at::Tensor keep = at::empty(shape, at::kFloat).bernoulli_(1.0 - p, generator_).to(at::kBool);
  return device.is_cpu() ? keep : keep.to(device);
}

at::Tensor RandomStream::uniform(int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  return at::empty({n}, at::kFloat).uniform_(0, 1, generator_);
}

}  // namespace colossal::nn
