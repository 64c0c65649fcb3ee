// Activation checkpointing: a block's forward runs without keeping its activations (only its input), and
// backward runs it again under grad mode from that input, with the random state the first run started
// from (so dropout draws the same masks), then backpropagates through the rerun (Chen et al. 2016;
// Colossal-AI's and Megatron's "full" recompute). Parameters' gradients accumulate into their .grad as a
// normal backward's do. The block hook chain applies it to the blocks the engine chose (block_hooks.h:
// gather -> recompute -> profile), so a block gathered by ZeRO-3 is gathered again before its rerun.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <functional>

namespace colossal::nn {

// forward(x), its activations dropped and recomputed in backward. `forward` must stay valid until that
// backward (it is kept): capture by value. Without grad mode it is forward(x).
at::Tensor recomputed(std::function<at::Tensor(const at::Tensor&)> forward, const at::Tensor& x);

// What a block's activations cost, for choosing which to recompute (activation_checkpoint = "auto"):
// called on this thread around each recomputed block's first run, before its forward (null) and after
// it with the block's graph still alive (its output), so the caller can read the bytes the block would
// keep and the time it took. One observer a thread; an empty function removes it.
// The default generator's state on `device` (dropout's draws come from it), and setting it back.
at::Tensor generator_state(const c10::Device& device);
void set_generator_state(const c10::Device& device, const at::Tensor& state);

// Whether this thread is rerunning a block for its backward: the graph being built is consumed at once,
// so a layer that would save less and recompute more in its own backward (linear_forward.h's projection
// after GELU) saves as usual instead.
bool rerunning_for_backward();

// Blocks this thread has run as recomputed (under grad mode) since the last call, which resets the count:
// the LM head asks at the end of each forward whether the backward ahead will rerun blocks.
int64_t take_recomputed_blocks();

using RecomputeObserver = std::function<void(const at::Tensor* output)>;
void set_recompute_observer(RecomputeObserver observer);

}  // namespace colossal::nn
