// Kernel choice: for each CPU kernel of ours that has an ATen equivalent (fused attention, GELU,
// LayerNorm, the dense layers' GEMMs, decoding GEMV and decoding attention), which of the two runs.
// The engine never runs a kernel that clearly loses on the machine at hand: on the first call at a
// shape, both are timed on that call's own inputs (two warm-ups and five alternating calls each, the
// fastest of each side counted; ten more each when the two are within 10%), the faster is kept for that
// shape for the rest of the process and the choice is logged once, as cuDNN's benchmark mode does. Ours
// is kept unless ATen is more than 3% faster: our kernels' results do not depend on the batch or the
// thread count, and a tie must not flip from run to run with the machine's noise. A recipe's [kernels]
// section or `infer --kernels` can force either side. Choices travel in checkpoints, so a resumed run
// computes with the kernels the original run chose.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>

namespace colossal::nn {

enum class KernelPath { Auto, Ours, Aten };

struct KernelPolicy {
  KernelPath attention = KernelPath::Auto;
  KernelPath gelu = KernelPath::Auto;
  KernelPath gemv = KernelPath::Auto;
  KernelPath layer_norm = KernelPath::Auto;
  KernelPath gemm = KernelPath::Auto;
  // Dense layers with no gradient to record and more rows than the decoding GEMV takes (a prefill, a
  // server's step with prompt chunks). Auto times our GEMM against ATen's per weight and power of two of
  // rows, which pays off in a long-running server (`serve` sets it) or where the choices are kept for
  // later runs (engine/kernel_cache.h: `infer` sets it then); a one-shot `infer` without that cache
  // prefills once, so it keeps ATen's rather than time every shape of its single prefill.
  KernelPath inference_gemm = KernelPath::Aten;
  // A pre-norm block's one-token decoding step on CPU runs as one parallel region
  // (kernels/cpu/decode_block.h) where every part of it runs our decoding kernels; false: op by op (the
  // same kernels and bits; tests and benchmarks compare the two).
  bool fused_decode_block = true;
};

// "auto" | "fused" | "aten" (the recipe's and the flag's spelling); throws std::invalid_argument.
KernelPath parse_kernel_path(const std::string& name);
const char* kernel_path_name(KernelPath path);

void set_kernel_policy(const KernelPolicy& policy);   // also forgets earlier timed choices
KernelPolicy kernel_policy();
// Counts the changes that can turn a decided choice around (a new policy, restored choices): a caller
// that keeps what the choices implied for a shape keeps it while this stays the same.
uint64_t kernel_choice_epoch();

// A decision its owner looks up once per key (its compact form of a shape) and kernel_choice_epoch():
// a decoding step asks the same few questions of every layer, and building the choice's shape string and
// searching the map for each cost a block 20-40 us of a 0.4 ms int4 step (its cache lines evicted by the
// weights streamed in between). `decide` returns the choice, or nullopt while it is undecided (asked again
// next time). For one caller thread at a time, as a module's forward is.
class ChoiceMemo {
 public:
  template <class Decide>
  bool get(int64_t key, const Decide& decide) {
    const uint64_t epoch = kernel_choice_epoch();
    if (known_ && epoch == epoch_ && key == key_) return value_;
    const std::optional<bool> d = decide();
    if (!d) return false;
    known_ = true, epoch_ = epoch, key_ = key, value_ = *d;
    return value_;
  }

 private:
  bool known_ = false, value_ = false;
  uint64_t epoch_ = 0;
  int64_t key_ = 0;
};

// The choice for `kernel` at `shape` (e.g. "B=16 T=128 H=4 D=32 fwd+bwd") when it needs no timing:
// `forced` unless Auto, else the remembered one. Callers check this first, so the inputs a timing
// needs are built only on a shape's first call.
std::optional<bool> decided_ours(const std::string& kernel, KernelPath forced, const std::string& shape);
// Times `ours` against `aten` now (each runs the whole operation once per call), remembers and logs
// the choice (the faster, ours within 3%); returns whether ours was chosen. `before_each`, when given,
// runs before every call of either side, untimed: it puts the operands where the real calls find them
// (a decoding GEMV's weight out of the caches).
bool time_and_choose(const std::string& kernel, const std::string& shape, const std::function<void()>& ours,
                     const std::function<void()>& aten, const std::function<void()>& before_each = {});
// Both in one: the decided choice, else the timed one.
bool use_ours(const std::string& kernel, KernelPath forced, const std::string& shape, const std::function<void()>& ours,
              const std::function<void()>& aten, const std::function<void()>& before_each = {});

// Every timed choice so far, "kernel shape" -> "fused" | "aten"; and the reverse, for resume.
std::map<std::string, std::string> kernel_choices();
void restore_kernel_choices(const std::map<std::string, std::string>& choices);

}  // namespace colossal::nn
