// AdamW: see adamw.h.
#include "src/optim/adamw.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <cmath>
#include <map>
#include <utility>

#include "kernels/cpu/adamw.h"
#include "kernels/cuda/built.h"
#if COLOSSAL_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "kernels/cuda/adamw.h"
#endif

namespace colossal::optim {
namespace {

// A piece the CUDA kernel takes: fp32 throughout, contiguous, on a GPU (and the kernel built).
bool cuda_kernel_takes([[maybe_unused]] const ParamPiece& piece) {
#if COLOSSAL_CUDA_KERNELS
  const auto fits = [&](const at::Tensor& t) {
    return t.is_cuda() && t.scalar_type() == at::kFloat && t.is_contiguous() && t.device() == piece.param.device();
  };
  return fits(piece.param) && fits(piece.grad) && fits(piece.state[0]) && fits(piece.state[1]);
#else
  return false;
#endif
}

}  // namespace

void AdamW::update_on_gpu([[maybe_unused]] const std::vector<ParamPiece*>& pieces, [[maybe_unused]] const StepContext& ctx) {
#if COLOSSAL_CUDA_KERNELS
  // One kernel call per device and weight decay (pieces are tensors or their ranges: two decays in practice).
  std::map<std::pair<c10::DeviceIndex, double>, std::vector<kernels::AdamWDevicePiece>> groups;
  for (ParamPiece* piece : pieces)
    groups[{piece->param.get_device(), piece->weight_decay}].push_back(
        {piece->param.data_ptr<float>(), piece->grad.data_ptr<float>(), piece->state[0].data_ptr<float>(),
         piece->state[1].data_ptr<float>(), piece->param.numel()});
  for (const auto& [key, group] : groups) {
    const c10::cuda::CUDAGuard guard(key.first);
    const kernels::AdamWHyper h{ctx.lr, opt_.beta1, opt_.beta2, opt_.eps, key.second, step_, ctx.grad_scale};
    kernels::adamw_step_cuda(group.data(), static_cast<int64_t>(group.size()), h, c10::cuda::getCurrentCUDAStream(key.first).stream());
  }
#endif
}

void AdamW::update(std::vector<ParamPiece>& pieces, const StepContext& ctx) {
  const double lr = ctx.lr;
  std::vector<ParamPiece*> on_gpu;
  for (auto& piece : pieces) {
    at::Tensor &p = piece.param, &grad = piece.grad, &m = piece.state[0], &v = piece.state[1];
    const kernels::AdamWHyper h{lr, opt_.beta1, opt_.beta2, opt_.eps, piece.weight_decay, step_, ctx.grad_scale};
    const bool half = grad.scalar_type() == at::kBFloat16 || grad.scalar_type() == at::kHalf;
    if (half && p.is_cpu() && grad.is_cpu() && p.scalar_type() == at::kFloat && p.is_contiguous() && grad.is_contiguous() &&
        m.is_contiguous() && v.is_contiguous()) {
      kernels::adamw_step_half(p.data_ptr<float>(), static_cast<const uint16_t*>(grad.const_data_ptr()),
                               grad.scalar_type() == at::kBFloat16 ? kernels::Half16::bf16 : kernels::Half16::fp16, m.data_ptr<float>(),
                               v.data_ptr<float>(), p.numel(), h, piece.grad_factor);
      continue;
    }
    if (half) {   // elsewhere (a compact shard on a GPU): the fp32 copy the kernel above avoids, in a piece
      // of its own, since the caller keeps its pieces' views of the shard from step to step
      at::NoGradGuard no_grad;
      std::vector<ParamPiece> widened{piece};
      widened[0].grad = grad.to(p.options());
      if (piece.grad_factor != 1.0) widened[0].grad.mul_(piece.grad_factor);
      widened[0].grad_factor = 1.0;
      update(widened, ctx);
      continue;
    }
    if (cuda_kernel_takes(piece)) {
      on_gpu.push_back(&piece);
    } else if (p.is_cpu() && p.scalar_type() == at::kFloat) {
      kernels::adamw_step(p.data_ptr<float>(), grad.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(), p.numel(), h);
    } else if (p.is_cpu() && p.scalar_type() == at::kDouble) {
      kernels::adamw_step(p.data_ptr<double>(), grad.data_ptr<double>(), m.data_ptr<double>(), v.data_ptr<double>(), p.numel(), h);
    } else if (p.is_cuda()) {
      if (ctx.grad_scale != 1) grad.mul_(ctx.grad_scale);
      // Where our kernel was not built (no nvcc) or the piece is not fp32: ATen's fused AdamW, the same
      // update (decay, moments, bias corrections, eps outside the root). It reads the step count from a
      // device tensor, so the host never waits on the GPU.
      if (!device_step_.defined()) device_step_ = at::zeros({}, p.options().dtype(at::kFloat));
      device_step_.fill_(static_cast<double>(step_));
      at::_fused_adamw_({p}, {grad}, {m}, {v}, {}, {device_step_}, lr, opt_.beta1, opt_.beta2, piece.weight_decay, opt_.eps,
                        /*amsgrad=*/false, /*maximize=*/false);
    } else {
      // Same arithmetic as the fused kernel, as tensor ops (other devices).
      at::NoGradGuard no_grad;
      if (ctx.grad_scale != 1) grad.mul_(ctx.grad_scale);
      const double bc1 = 1 - std::pow(opt_.beta1, static_cast<double>(step_));
      const double bc2 = 1 - std::pow(opt_.beta2, static_cast<double>(step_));
      p.mul_(1 - lr * piece.weight_decay);
      m.lerp_(grad, 1 - opt_.beta1);
      v.mul_(opt_.beta2).addcmul_(grad, grad, 1 - opt_.beta2);
      auto denom = (v.sqrt() / std::sqrt(bc2)).add_(opt_.eps);
      p.addcdiv_(m, denom, -lr / bc1);
    }
  }
  if (!on_gpu.empty()) update_on_gpu(on_gpu, ctx);
}

}  // namespace colossal::optim
