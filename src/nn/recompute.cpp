// Activation checkpointing: see recompute.h.
#include "src/nn/recompute.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <mutex>
#include <utility>

namespace colossal::nn {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The block's forward, kept on the autograd node until its backward reruns it.
struct Rerun : public torch::CustomClassHolder {
  std::function<at::Tensor(const at::Tensor&)> forward;
};

thread_local RecomputeObserver t_observer;
thread_local bool t_rerunning = false;        // rerunning_for_backward()
thread_local int64_t t_recomputed_blocks = 0;   // take_recomputed_blocks()

// t_rerunning set for a scope, and back to what it was when the scope ends (also by an exception).
struct Rerunning {
  bool outer = std::exchange(t_rerunning, true);
  ~Rerunning() { t_rerunning = outer; }
};

struct RecomputeFn : public torch::autograd::Function<RecomputeFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, c10::intrusive_ptr<Rerun> rerun) {
    ctx->saved_data["rng"] = generator_state(x.device());
    ctx->saved_data["rerun"] = c10::IValue::make_capsule(rerun);
    ctx->save_for_backward({x});
    // Under grad mode, as the rerun will be: kernels are chosen by whether a gradient is recorded, and the
    // two runs must compute the same values to the bit. The graph, and every activation it holds, is
    // dropped as this returns: nothing of the block's interior is kept.
    at::AutoGradMode grad_mode(true);
    if (!t_observer) return rerun->forward(x.detach().requires_grad_(x.requires_grad())).detach();
    t_observer(nullptr);
    const at::Tensor y = rerun->forward(x.detach().requires_grad_(x.requires_grad()));
    t_observer(&y);
    return y.detach();
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const at::Tensor input = ctx->get_saved_variables()[0];
    auto rerun = c10::static_intrusive_pointer_cast<Rerun>(ctx->saved_data["rerun"].toCapsule());
    const at::Tensor now = generator_state(input.device());
    set_generator_state(input.device(), ctx->saved_data["rng"].toTensor());   // the first run's masks
    at::Tensor x = input.detach().requires_grad_(input.requires_grad());
    at::Tensor y;
    {
      at::AutoGradMode grad_mode(true);
      Rerunning rerunning;
      y = rerun->forward(x);
    }
    set_generator_state(input.device(), now);   // the rest of backward, and the next step, continue where they were
    torch::autograd::backward({y}, {grad[0]});   // parameters' gradients accumulate as usual
    return {x.grad(), at::Tensor()};
  }
};

}  // namespace

at::Tensor generator_state(const c10::Device& device) {
  auto gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_generator_state(const c10::Device& device, const at::Tensor& state) {
  auto gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

void set_recompute_observer(RecomputeObserver observer) { t_observer = std::move(observer); }

bool rerunning_for_backward() { return t_rerunning; }

int64_t take_recomputed_blocks() { return std::exchange(t_recomputed_blocks, 0); }

at::Tensor recomputed(std::function<at::Tensor(const at::Tensor&)> forward, const at::Tensor& x) {
  if (!at::GradMode::is_enabled()) return forward(x);
  ++t_recomputed_blocks;
  auto rerun = c10::make_intrusive<Rerun>();
  rerun->forward = std::move(forward);
  return RecomputeFn::apply(x, rerun);
}

}  // namespace colossal::nn
