// The life of one parameter tensor in the chunk store, as an explicit transition table. A chunk acts
// on its tensors' states together: it is released (ZeRO-3) when every tensor is held, and its
// gradients are reduced when every tensor is ready for reduce.
//
//   free              storage not on this rank (a ZeRO-3 chunk released to its shard)
//   hold              values present, no computation using them
//   compute           a block's forward or backward is using them
//   hold_after_bwd    the block's backward is done; the gradient may still be accumulating
//   ready_for_reduce  the gradient for this backward is final
//
// Colossal-AI ignores an illegal transition silently; here it is an Error naming the tensor and both
// states, because it means a hook fired out of order and a gradient or a release would go wrong.
#pragma once
#include <cstdint>
#include <string>

namespace colossal::memory {

enum class TensorState : uint8_t { free, hold, compute, hold_after_bwd, ready_for_reduce };
constexpr int kTensorStates = 5;

const char* state_name(TensorState s);
bool transition_allowed(TensorState from, TensorState to);
// `state` = to, or an Error naming `tensor`, both states and the states `from` may go to.
void transition(TensorState& state, TensorState to, const std::string& tensor);

}  // namespace colossal::memory
