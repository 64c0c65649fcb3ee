// Tensor state transitions: see tensor_state.h.
#include "src/memory/tensor_state.h"

#include "src/core/error.h"

namespace colossal::memory {
namespace {

using S = TensorState;
// kAllowed[from][to]. Why each is legal:
//   free -> hold|compute             gathered ahead (prefetch) or on demand
//   hold -> compute                   a block starts using it
//   hold -> free                      released after use (ZeRO-3)
//   hold -> ready_for_reduce          its gradient arrived with no block hooks watching (ZeRO 0-2)
//   compute -> hold                   forward finished
//   compute -> hold_after_bwd         the block's backward finished first
//   compute -> ready_for_reduce       its gradient finished first (accumulation runs beside the block)
//   hold_after_bwd -> compute         a tied weight used again by an earlier block's backward
//   hold_after_bwd -> ready_for_reduce  its gradient finished
//   ready_for_reduce -> hold|free     reduced; kept (ZeRO 0-2) or released to the shard (ZeRO-3)
constexpr bool kAllowed[kTensorStates][kTensorStates] = {
    /* free */ {false, true, true, false, false},
    /* hold */ {true, false, true, false, true},
    /* compute */ {false, true, false, true, true},
    /* hold_after_bwd */ {false, false, true, false, true},
    /* ready_for_reduce */ {true, true, false, false, false},
};

}  // namespace

const char* state_name(TensorState s) {
  switch (s) {
    case S::free: return "free";
    case S::hold: return "hold";
    case S::compute: return "compute";
    case S::hold_after_bwd: return "hold_after_bwd";
    case S::ready_for_reduce: return "ready_for_reduce";
  }
  return "?";
}

bool transition_allowed(TensorState from, TensorState to) {
  return kAllowed[static_cast<int>(from)][static_cast<int>(to)];
}

void transition(TensorState& state, TensorState to, const std::string& tensor) {
  if (!transition_allowed(state, to)) {
    std::string valid;
    for (int t = 0; t < kTensorStates; ++t)
      if (kAllowed[static_cast<int>(state)][t]) valid += std::string(valid.empty() ? "" : ", ") + state_name(static_cast<S>(t));
    throw Error("chunk store: tensor \"" + tensor + "\" cannot go from " + state_name(state) + " to " + state_name(to) +
                " (from " + state_name(state) + " it may go to " + valid + "); a hook ran out of order");
  }
  state = to;
}

}  // namespace colossal::memory
