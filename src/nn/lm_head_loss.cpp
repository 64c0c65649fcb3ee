// Fused LM head + cross entropy: see lm_head_loss.h.
#include "src/nn/lm_head_loss.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "kernels/cpu/cross_entropy.h"
#include "src/nn/gemm_choice.h"
#include "src/nn/recompute.h"

namespace colossal::nn {
namespace {

// The CPU logits [N, V], kept by each thread (ranks run as threads in the tests) and reused by the next
// step once nothing else holds them (the last graph has released its saved copy). At GPT-2's vocabulary
// and 1024 tokens they are 206 MB: past glibc's mmap threshold (32 MB at most), so a new tensor every
// step was mapped afresh and faulted in 4 KB at a time, 50305 page faults a step inside the head's
// forward, and unmapped again after its backward. Keeping them costs no peak where the forward's end is
// the step's peak (they are its largest activation). Under activation checkpointing it is not: the
// backward reruns blocks after the head's gradient is done, and kept logits would sit under every rerun
// (gpt-tiny's live tensors at the peak rose 4 MB with every block recomputed, past recomputing every
// other one). So a forward that recomputes any block (recompute.h) gets new logits, and the kept ones
// are let go.
at::Tensor reusable_logits(int64_t n, int64_t v, const at::TensorOptions& options) {
  thread_local at::Tensor kept;
  if (take_recomputed_blocks() > 0) {
    kept = at::Tensor();
    return at::empty({n, v}, options);
  }
  if (kept.defined() && kept.use_count() == 1 && kept.storage().use_count() == 1 && kept.size(0) == n &&
      kept.size(1) == v && kept.scalar_type() == options.dtype().toScalarType())
    return kept;
  kept = at::Tensor();   // freed first when unused, so a new shape does not hold both
  kept = at::empty({n, v}, options);
  return kept;
}

struct LmHeadCrossEntropy : public torch::autograd::Function<LmHeadCrossEntropy> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x_in, const at::Tensor& weight,
                            const at::Tensor& targets) {
    // On CPU the head's three products go through gemm_choice.h like every dense layer's.
    const bool gemm = gemm_applies(x_in, weight);
    const at::Tensor x = gemm ? x_in.contiguous() : x_in;
    at::Tensor logits;   // [N, V]; becomes d(loss)/d(logits)
    if (gemm) {
      logits = reusable_logits(x.size(0), weight.size(0), x.options());
      gemm_linear_into(x, weight, {}, logits);
    } else {
      logits = at::mm(x, weight.t());
    }
    const int64_t n = logits.size(0), v = logits.size(1);
    at::Tensor loss;
    if (logits.is_cpu() && logits.scalar_type() == at::kFloat) {
      const int64_t counted = targets.ge(0).sum().item<int64_t>();
      const double grad_scale = counted > 0 ? 1.0 / static_cast<double>(counted) : 0.0;
      auto t = targets.contiguous();
      auto losses = at::empty({n}, logits.options());
      kernels::softmax_cross_entropy_inplace(logits.data_ptr<float>(), t.data_ptr<int64_t>(), losses.data_ptr<float>(), n,
                                             v, static_cast<float>(grad_scale));
      loss = losses.sum() * grad_scale;
    } else {
      // Other devices and dtypes: the same quantities from ATen ops, in place over the logits, and with
      // the 1/count scale kept as a tensor so a GPU step never waits on the host here.
      // bf16 and fp16 logits are taken to fp32 for the softmax and the loss (as autocast does), and the
      // gradient is stored back in their type.
      const bool low = logits.scalar_type() == at::kBFloat16 || logits.scalar_type() == at::kHalf;
      at::Tensor work = low ? logits.to(at::kFloat) : logits;
      auto valid = targets.ge(0);
      auto safe = targets.clamp_min(0);
      auto scale = valid.sum().clamp_min(1).to(work.scalar_type()).reciprocal();   // 1/counted
      auto lse = at::logsumexp(work, 1);
      auto picked = work.gather(1, safe.unsqueeze(1)).squeeze(1);
      loss = ((lse - picked) * valid).sum() * scale;
      work.sub_(lse.unsqueeze(1)).exp_();                     // softmax
      work.scatter_add_(1, safe.unsqueeze(1), -valid.to(work.scalar_type()).unsqueeze(1));
      work.mul_((valid * scale).unsqueeze(1));
      if (low) logits.copy_(work);
    }
    ctx->save_for_backward({x, weight, logits});
    return loss;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1];
    const at::Tensor& dlogits = saved[2];                       // [N, V], already scaled by 1/N
    // The incoming scalar (1, or 1/grad_accum) scales the two products rather than the [N, V] buffer.
    // Off the CPU it stays a tensor (reading it would be a sync per backward).
    const at::Tensor& g = grad_out[0];
    if (!g.is_cpu()) return {at::mm(dlogits, weight).mul_(g), at::mm(dlogits.t(), x).mul_(g), at::Tensor()};
    const double scale = g.item<double>();
    const bool gemm = gemm_applies(x, weight);
    at::Tensor dx = gemm ? gemm_input_grad(dlogits, weight) : at::mm(dlogits, weight);
    if (scale != 1.0) dx.mul_(scale);
    // The weight's gradient [V, C] (154 MB at GPT-2's vocabulary) goes straight into its .grad buffer
    // when there is one (grad_buffer_of): no new tensor at the step's peak.
    if (gemm && scale == 1.0) return {dx, gemm_weight_grad_for(weight, dlogits, x), at::Tensor()};
    if (at::Tensor acc = grad_buffer_of(weight, dlogits); acc.defined()) {
      acc.addmm_(dlogits.t(), x, /*beta=*/1, /*alpha=*/scale);   // our GEMM has no scale
      return {dx, at::Tensor(), at::Tensor()};
    }
    at::Tensor dw = at::mm(dlogits.t(), x);
    if (scale != 1.0) dw.mul_(scale);
    return {dx, dw, at::Tensor()};
  }
};

}  // namespace

at::Tensor lm_head_cross_entropy(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& targets) {
  return LmHeadCrossEntropy::apply(x, weight, targets);
}

}  // namespace colossal::nn
