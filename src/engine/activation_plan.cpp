// Activation plans: see activation_plan.h.
#include "src/engine/activation_plan.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <cmath>
#include <chrono>

#include "src/core/device.h"
#include "src/core/error.h"
#include "src/core/text.h"
#include "src/engine/train_plan.h"
#include "src/nn/recompute.h"
#include "models/registry.h"

namespace colossal {

std::vector<bool> fixed_recompute_mask(const MemoryConfig& m, int64_t blocks) {
  if (m.activation_checkpoint == "none" || m.activation_checkpoint == "auto") return {};
  std::vector<bool> r(static_cast<size_t>(blocks));
  for (int64_t i = 0; i < blocks; ++i) r[static_cast<size_t>(i)] = m.activation_checkpoint == "full" || i % m.checkpoint_every == 0;
  return r;
}

namespace {

// The default generators' states (the host's and the compute device's), set back when it goes: the
// measuring forward draws dropout masks the run must draw again.
struct KeepGenerators {
  explicit KeepGenerators(const c10::Device& device) {
    devices.emplace_back(c10::kCPU);
    if (!device.is_cpu()) devices.push_back(device);
    for (const auto& d : devices) states.push_back(nn::generator_state(d));
  }
  ~KeepGenerators() {
    for (size_t i = 0; i < devices.size(); ++i) nn::set_generator_state(devices[i], states[i]);
  }
  std::vector<c10::Device> devices;
  std::vector<at::Tensor> states;
};

}  // namespace

std::vector<memory::BlockActivation> measure_block_activations(TrainPlan& p) {
  auto* hooks = const_cast<nn::BlockHooks*>(p.model->block_hooks());
  if (!hooks) throw Error("activation_checkpoint = \"auto\": the model has no block-hook chain (internal)");
  const int64_t blocks = static_cast<int64_t>(p.model->blocks().size());
  const KeepGenerators keep(p.device);
  hooks->set_recompute(std::vector<bool>(static_cast<size_t>(blocks), true));
  p.task->start(0);   // run_loop starts the loader again where the run is
  const Batch batch = p.local_part(p.task->next().to(p.device));
  auto live = [&]() -> double {
    return p.device.is_cpu() ? static_cast<double>(p.counter ? p.counter->live() : 0) : static_cast<double>(device_allocated_bytes(p.device));
  };
  std::vector<memory::BlockActivation> out;
  double before = 0;
  std::chrono::steady_clock::time_point t0;
  nn::set_recompute_observer([&](const at::Tensor* y) {
    synchronize_device(p.device);
    if (!y) {
      before = live();
      t0 = std::chrono::steady_clock::now();
      return;
    }
    out.push_back({live() - before, static_cast<double>(y->nbytes()),
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()});
  });
  // Twice: the first forward also times the kernels' first uses (kernels = "auto"); the second's figures count.
  try {
    for (int pass = 0; pass < 2; ++pass) {
      out.clear();
      at::AutoGradMode grad(true);
      p.strategy->before_forward();
      (void)p.task->loss(*p.model, batch);   // the graph (the blocks' outputs) dropped here
    }
  } catch (...) {
    nn::set_recompute_observer({});
    throw;
  }
  nn::set_recompute_observer({});
  if (static_cast<int64_t>(out.size()) != blocks)
    throw Error("activation_checkpoint = \"auto\": measured " + std::to_string(out.size()) + " of " + std::to_string(blocks) + " blocks (internal)");
  if (p.counter) p.counter->take_peak(memory::AllocationCounter::step);
  return out;
}

std::vector<memory::BlockActivation> estimate_block_activations(const Recipe& r) {
  const double compute = r.precision.dtype == "fp32" ? 4 : 2;
  const double b = static_cast<double>(r.train.batch_size), t = static_cast<double>(tokens_per_sample(r));
  const double c = static_cast<double>(r.model.n_embd) / static_cast<double>(r.parallel.tensor);
  const double stream = compute * b * t * c;
  return std::vector<memory::BlockActivation>(static_cast<size_t>(r.model.n_layer), {17 * stream, stream, 1.0});
}

memory::RecomputePlan choose_recompute(const Recipe& r, const std::vector<memory::BlockActivation>& blocks, const std::string& how) {
  const double budget = r.memory.activation_memory_gb * 1073741824.0;
  memory::RecomputePlan plan = memory::plan_recompute(blocks, budget);
  if (!plan.recompute.empty()) return plan;
  const double least = memory::smallest_budget(blocks);
  throw RecipeError(r.where("memory.activation_memory_gb"),
                    "= " + format_number(r.memory.activation_memory_gb) + " (" + human_bytes(budget) + ") is below what the blocks' " +
                        "activations of one micro-batch need even with every block recomputed (" + how + "): the smallest target that works is " +
                        format_number(std::ceil(least / 1073741824.0 * 1000) / 1000) + " (" + human_bytes(least) +
                        "); raise it, or lower train.batch_size or train.seq_len");
}

std::string describe_recompute(const Recipe& r, const memory::RecomputePlan& plan) {
  std::string which;
  for (size_t i = 0; i < plan.recompute.size(); ++i)
    if (plan.recompute[i]) which += (which.empty() ? "" : ", ") + std::to_string(i);
  return "recomputing " + std::to_string(plan.count()) + " of " + std::to_string(plan.recompute.size()) + " blocks" +
         (which.empty() ? "" : " (" + which + ")") + ": " + human_bytes(plan.peak) + " of activations for a target of " +
         human_bytes(r.memory.activation_memory_gb * 1073741824.0) + ", " + format_number(std::round(plan.seconds * 1e4) / 10) +
         " ms of reruns a micro-batch";
}

}  // namespace colossal
