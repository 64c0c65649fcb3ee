// RandomStream: a random stream of a tensor-parallel rank's own, for dropout inside a split region
// (Megatron's RNG tracker). Dropout on activations every rank of the group holds whole (embeddings,
// residual branches) must draw the same mask on every rank, so it draws from the default generator,
// which the ranks keep in step. Dropout on what a rank holds alone (its attention heads' probabilities)
// must draw independent masks per rank, or every rank's heads would share one: it draws from this
// stream, an explicit generator, so the default one is never touched (nor swapped, which would race
// between ranks run as threads of one process).
#pragma once
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <cstdint>
#include <mutex>

namespace colossal::nn {

class RandomStream {
 public:
  explicit RandomStream(uint64_t seed);
  // A bool mask of `shape` on `device`, true with probability 1 - p (kept), drawn on the host.
  at::Tensor keep_mask(at::IntArrayRef shape, double p, const c10::Device& device);
  // n uniform draws in [0, 1) (tests: two ranks' streams differ).
  at::Tensor uniform(int64_t n);

 private:
  std::mutex mu_;
  at::Generator generator_;
};

}  // namespace colossal::nn
