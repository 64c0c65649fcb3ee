// Decoding steps captured as CUDA graphs. On a GPU a one-token step of a small or mid-sized model is
// bound by the host: each block launches a dozen small kernels, and the GPU waits between them (4.7 ms a
// step for a 700M GPT on an H100 whose weights read in 0.95 ms). A captured step is one graph launch.
//
// A graph fixes every shape and address, so a step here runs over a window of W cached positions (W the
// position rounded up to `window_step`, at most the cache's capacity) whatever the position inside it:
// the token ids, their positions and the write position (LayerKv::slot) live in one device buffer the
// host fills before each replay, and the step's mask, keys at or past each sequence's padding and at or
// before the slot, is computed inside the graph. A step that crosses into the next window captures it
// once (the older graph is dropped: windows only grow in one generation). Keys past the slot are masked
// and read as zeros, never as stale memory that could hold a NaN.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <memory>
#include <string>
#include <vector>

#include "src/nn/causal_lm.h"

namespace colossal {

// The step a graph captures, on any device (so the CPU's tests check it too): tokens `ids` [B, 1] at
// `positions` [B, 1], their keys and values written at `slot` [1] (int64, all three on the cache's
// device), attending over the window [0, w) of `cache` to the keys at or past `pad` [B, 1, 1, 1] and at
// or before the slot. Returns the logits [B, 1, V]; cache.length is not read or moved. The window's keys
// and values past the slot are masked but still multiplied by zero weights, so they must be finite:
// zero_unfilled clears them once after the prefill.
at::Tensor windowed_decode_step(nn::CausalLM& model, const nn::KvCache& cache, const at::Tensor& ids, const at::Tensor& positions,
                                const at::Tensor& slot, const at::Tensor& pad, int64_t w);

// The window a step at `position` runs over: the position's count (position + 1) rounded up to `step`,
// at most `capacity`.
int64_t decode_window(int64_t position, int64_t capacity, int64_t step);

// Zeros every layer's keys and values at positions [cache.length, capacity) (at::empty's memory may hold NaN).
void zero_unfilled(nn::KvCache& cache);

class DecodeGraphs {
 public:
  static constexpr int64_t kWindowStep = 128;

  // Why captured steps cannot decode `model` on `device`, or "" where they can: a CUDA device, a build
  // with the CUDA runtime, and no block hooks (streamed weights and pipeline stages run host code
  // between blocks at every step).
  static std::string unsupported(const nn::CausalLM& model, const c10::Device& device);

  // Steps of `model` over `cache` (filled to cache.length by the prefill), whose sequence i starts after
  // pad[i] positions of left padding. The cache's positions past its length are zeroed here (zero_unfilled).
  DecodeGraphs(nn::CausalLM& model, nn::KvCache& cache, const std::vector<int64_t>& pad, const c10::Device& device,
               int64_t window_step = kWindowStep);
  ~DecodeGraphs();
  DecodeGraphs(const DecodeGraphs&) = delete;
  DecodeGraphs& operator=(const DecodeGraphs&) = delete;

  // The logits [B, V] on the device of tokens `next` [B] (int64, CPU) at position cache.length: what
  // model.forward gives there with the generator's positions and padding mask. Advances cache.length.
  // Throws where a capture fails (the cache is then as before the call, save this step's own key and
  // value, which an eager step writes again).
  at::Tensor step(const at::Tensor& next);

  int64_t captures() const;   // graphs captured so far
  int64_t window() const;     // the current graph's window, 0 before the first

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace colossal
