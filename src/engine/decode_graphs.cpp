// Decoding steps captured as CUDA graphs: see decode_graphs.h.
#include "src/engine/decode_graphs.h"

#include <ATen/ATen.h>
#include <algorithm>

#include "kernels/cuda/built.h"
#include "src/core/error.h"
#include "src/nn/block_hooks.h"
#if COLOSSAL_CUDA_KERNELS
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace colossal {

std::string DecodeGraphs::unsupported(const nn::CausalLM& model, const c10::Device& device) {
  if (!device.is_cuda()) return "the device is not a GPU";
#if !COLOSSAL_CUDA_KERNELS
  return "this build has no CUDA runtime (LibTorch without CUDA, or no nvcc)";
#endif
  if (const nn::BlockHooks* hooks = model.block_hooks(); hooks && !hooks->empty())
    return "the blocks run host code between them (streamed weights or a pipeline stage)";
  return "";
}

at::Tensor windowed_decode_step(nn::CausalLM& model, const nn::KvCache& cache, const at::Tensor& ids, const at::Tensor& positions,
                                const at::Tensor& slot, const at::Tensor& pad, int64_t w) {
  TORCH_CHECK(w >= 1 && w <= cache.capacity, "windowed_decode_step: window ", w, " in a cache of ", cache.capacity);
  nn::KvCache view = cache;   // the same tensors; the host's offset is the window's last position
  view.length = w - 1;
  for (auto& layer : view.layers) layer.slot = slot;
  const at::Tensor keys = at::arange(w, slot.options()).view({1, 1, 1, w});
  nn::ForwardOptions o;
  o.cache = &view;
  o.positions = positions;
  o.mask = (keys >= pad) & (keys <= slot.view({1, 1, 1, 1}));   // [B, 1, 1, W]
  o.last_only = true;
  return model.forward(ids, o);
}

int64_t decode_window(int64_t position, int64_t capacity, int64_t step) {
  return std::min(capacity, (position + step) / step * step);
}

void zero_unfilled(nn::KvCache& cache) {
  for (auto& layer : cache.layers) {
    layer.k.narrow(2, cache.length, cache.capacity - cache.length).zero_();
    layer.v.narrow(2, cache.length, cache.capacity - cache.length).zero_();
  }
}

#if COLOSSAL_CUDA_KERNELS

struct DecodeGraphs::Impl {
  nn::CausalLM& model;
  nn::KvCache& cache;
  c10::Device device;
  int64_t b, window_step;
  at::Tensor staging;   // pinned host: ids [B], positions [B], slot [1]
  at::Tensor inputs;    // the same on the device, read by the graph
  at::Tensor pad;       // [B, 1, 1, 1] int64 on the device: each sequence's first real position
  std::vector<int64_t> pad_host;
  at::cuda::CUDAEvent copied;   // the last transfer of `staging`, which must end before it is refilled
  std::unique_ptr<at::cuda::CUDAGraph> graph;
  at::Tensor logits;    // the graph's output [B, 1, V]
  int64_t window = 0, captures = 0;

  Impl(nn::CausalLM& m, nn::KvCache& c, const std::vector<int64_t>& p, const c10::Device& d, int64_t step)
      : model(m), cache(c), device(d), b(static_cast<int64_t>(p.size())), window_step(step), pad_host(p) {
    const auto longs = at::TensorOptions().dtype(at::kLong);
    staging = at::empty({2 * b + 1}, longs.pinned_memory(true));
    inputs = at::zeros({2 * b + 1}, longs.device(device));
    pad = at::tensor(pad_host, longs).view({b, 1, 1, 1}).to(device);
    zero_unfilled(cache);
  }

  // One step over a window of `w` positions, reading `inputs`: the body both the warm-up and the capture run.
  at::Tensor run(int64_t w) {
    return windowed_decode_step(model, cache, inputs.narrow(0, 0, b).view({b, 1}), inputs.narrow(0, b, b).view({b, 1}),
                                inputs.narrow(0, 2 * b, 1), pad, w);
  }

  // Ends a capture that an exception left open, so the stream can run again.
  static void abandon_capture(const c10::cuda::CUDAStream& stream) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream.stream(), &status) == cudaSuccess && status != cudaStreamCaptureStatusNone) {
      cudaGraph_t partial = nullptr;
      (void)cudaStreamEndCapture(stream.stream(), &partial);
      if (partial) (void)cudaGraphDestroy(partial);
    }
    (void)cudaGetLastError();
  }

  void capture(int64_t w) {
    graph.reset();
    logits = at::Tensor();
    window = 0;
    // The prefill and this step's inputs are in place before the side stream reads them.
    c10::cuda::device_synchronize();
    const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, device.index());
    {
      const c10::cuda::CUDAStreamGuard on_side(side);
      // Warm-up outside the capture: lazy initialisation (cuBLAS handles and workspaces) must not be
      // captured. It is this step's own computation, so its key and value writes are the replay's.
      (void)run(w);
      auto g = std::make_unique<at::cuda::CUDAGraph>();
      try {
        g->capture_begin();
        logits = run(w);
        g->capture_end();
      } catch (...) {
        abandon_capture(side);
        logits = at::Tensor();
        throw;
      }
      graph = std::move(g);
    }
    c10::cuda::device_synchronize();
    window = w;
    ++captures;
  }

  at::Tensor step(const at::Tensor& next) {
    const int64_t at_pos = cache.length;
    TORCH_CHECK(next.numel() == b && next.scalar_type() == at::kLong && next.is_cpu(), "decode graphs: ", b,
                " int64 tokens on the CPU expected, got ", next.sizes(), " ", next.scalar_type());
    if (at_pos >= cache.capacity) throw Error("decode graphs: the cache of " + std::to_string(cache.capacity) + " positions is full");
    copied.synchronize();
    auto* s = staging.mutable_data_ptr<int64_t>();
    const auto nx = next.contiguous();
    const int64_t* ids = nx.const_data_ptr<int64_t>();
    for (int64_t i = 0; i < b; ++i) {
      s[i] = ids[i];
      s[b + i] = at_pos - pad_host[i];   // the generator's positions (at_pos is past every prompt)
    }
    s[2 * b] = at_pos;
    const c10::cuda::CUDAGuard on_device(device);
    inputs.copy_(staging, /*non_blocking=*/true);
    copied.record(c10::cuda::getCurrentCUDAStream(device.index()));
    if (const int64_t w = decode_window(at_pos, cache.capacity, window_step); w != window) capture(w);
    graph->replay();
    ++cache.length;
    return logits.squeeze(1);
  }
};

DecodeGraphs::DecodeGraphs(nn::CausalLM& model, nn::KvCache& cache, const std::vector<int64_t>& pad, const c10::Device& device,
                           int64_t window_step) {
  if (const std::string why = unsupported(model, device); !why.empty()) throw Error("decode graphs: " + why);
  const bool on_device = !cache.layers.empty() && cache.layers.front().k.is_cuda() &&
                         (!device.has_index() || cache.layers.front().k.get_device() == device.index());
  TORCH_CHECK(window_step > 0 && on_device && !cache.layers.front().paged, "decode graphs: a dense cache on ", device,
              " and a positive window step");
  impl_ = std::make_unique<Impl>(model, cache, pad, device, window_step);
}

DecodeGraphs::~DecodeGraphs() = default;
at::Tensor DecodeGraphs::step(const at::Tensor& next) { return impl_->step(next); }
int64_t DecodeGraphs::captures() const { return impl_->captures; }
int64_t DecodeGraphs::window() const { return impl_->window; }

#else   // no CUDA runtime in this build: unsupported() says so, and nothing can be constructed

struct DecodeGraphs::Impl {};

DecodeGraphs::DecodeGraphs(nn::CausalLM& model, nn::KvCache&, const std::vector<int64_t>&, const c10::Device& device, int64_t) {
  throw Error("decode graphs: " + unsupported(model, device));
}
DecodeGraphs::~DecodeGraphs() = default;
at::Tensor DecodeGraphs::step(const at::Tensor&) { return {}; }
int64_t DecodeGraphs::captures() const { return 0; }
int64_t DecodeGraphs::window() const { return 0; }

#endif

}  // namespace colossal
