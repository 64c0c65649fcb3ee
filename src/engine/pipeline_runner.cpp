// Pipeline runner: see pipeline_runner.h.
#include "src/engine/pipeline_runner.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <algorithm>
#include <array>
#include <chrono>
#include <map>
#include <spdlog/spdlog.h>

#include "src/core/device.h"
#include "src/core/error.h"
#include "src/engine/train_plan.h"
#include "models/registry.h"
#include "src/nn/block.h"
#include "src/nn/factory.h"
#include "src/nn/linear_forward.h"
#include "src/parallel/pipeline_partition.h"

namespace colossal {

int64_t pipeline_micro_batches(const ParallelConfig& c) {
  if (c.micro_batches > 0) return c.micro_batches;
  return 2 * c.pipeline;   // "auto": twice the stages (1F1B's bubble a third at most; interleaved's groups of P)
}

void check_pipeline_recipe(const Recipe& r) {
  const ParallelConfig& c = r.parallel;
  const int64_t p = c.pipeline, v = c.virtual_stages, m = pipeline_micro_batches(c);
  const std::string at = r.where("parallel.pipeline") + " = " + std::to_string(p) + ": ";
  if (r.model.n_layer < p * v)
    throw Error(at + "with " + std::to_string(v) + " chunk(s) a rank needs at least " + std::to_string(p * v) + " blocks, and the model has " +
                std::to_string(r.model.n_layer) + " (use fewer stages" + (v > 1 ? " or virtual_stages" : "") + ")");
  if (c.schedule == "interleaved" && m % p != 0)
    throw Error(r.where("parallel.micro_batches") + " = " + std::to_string(m) + ": the interleaved schedule runs micro-batches in groups of " +
                "pipeline = " + std::to_string(p) + " (use a multiple of " + std::to_string(p) + ")");
  if (r.memory.activation_checkpoint == "auto")
    throw Error(r.where("memory.activation_checkpoint") + " = \"auto\" with pipeline parallelism is not built yet (its measurement runs the "
                "whole model; use \"full\" or \"every_n\")");
  if (r.memory.zero >= 2)
    throw Error(r.where("memory.zero") + " = " + std::to_string(r.memory.zero) + " with pipeline parallelism is not built yet (use zero = 0 "
                "or 1: gradients accumulate over the schedule's micro-batches and are reduced once after them)");
}

struct PipelineRunner::Held {
  at::Tensor input;    // the received activation (a leaf requiring grad), undefined on stage 0
  at::Tensor output;   // what was sent on, or the loss on the last stage
  nn::DeferredWeightGrads weights;   // zero_bubble: the weight gradients its backward left for its W pass
};

namespace {

// Parameter `name` belongs to one of `modules` (module paths: "wte" holds "wte.weight").
bool in_any(const std::string& name, const std::vector<std::string>& modules) {
  return std::any_of(modules.begin(), modules.end(), [&](const std::string& m) {
    return name == m || (name.size() > m.size() && name.compare(0, m.size(), m) == 0 && name[m.size()] == '.');
  });
}

using Clock = std::chrono::steady_clock;

// Times block 0's forward and backward, and when they start and end, in a one-block copy of the model.
struct BlockTimer : nn::BlockHook {
  explicit BlockTimer(const c10::Device& d) : device(d) {}
  c10::Device device;
  Clock::time_point fwd_in, fwd_out, bwd_in, bwd_out;
  Clock::time_point now() const { return synchronize_device(device), Clock::now(); }
  void before_forward(int64_t) override { fwd_in = now(); }
  void after_forward(int64_t) override { fwd_out = now(); }
  void before_backward(int64_t) override { bwd_in = now(); }
  void after_backward(int64_t) override { bwd_out = now(); }
};

double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// partition = "profile": a block's forward and backward time, and the embedding's and the head's (with
// the loss), measured by rank 0 on one micro-batch through a one-block model of the same family and
// width (every block of a family has the same shape), and given to every rank so all cut alike.
std::array<double, 3> profiled_costs(const Recipe& r, Task& task, dist::Runtime& runtime, const c10::Device& device) {
  at::Tensor costs = at::zeros({3}, at::kDouble);
  if (runtime.is_root()) {
    ModelConfig one = r.model;
    one.n_layer = 1;
    nn::LayerFactory factory;
    auto model = build_model(one, factory);
    model->to(device);
    model->train();
    auto timer = std::make_shared<BlockTimer>(device);
    auto chain = std::make_shared<nn::BlockHooks>();
    chain->add(timer);
    model->set_block_hooks(chain);
    task.start(0);   // run_loop starts the loader again where the run is
    const Batch batch = task.next().to(device);
    for (int pass = 0; pass < 4; ++pass) {   // the first also times the kernels' first uses; the least of the rest
      const auto t0 = timer->now();
      task.loss(*model, batch).backward();
      const auto t1 = timer->now();
      const double block = seconds(timer->fwd_in, timer->fwd_out) + seconds(timer->bwd_in, timer->bwd_out);
      const double embed = seconds(t0, timer->fwd_in) + seconds(timer->bwd_out, t1);
      const double head = seconds(timer->fwd_out, timer->bwd_in);
      const at::Tensor now = at::tensor({block, embed, head}, at::kDouble);
      costs = pass == 1 ? now : pass > 1 ? at::minimum(costs, now) : costs;
    }
    spdlog::info("partition profile: a block {:.1f} ms, the embedding {:.1f} ms, the head and loss {:.1f} ms (forward and backward)",
                 costs[0].item<double>() * 1e3, costs[1].item<double>() * 1e3, costs[2].item<double>() * 1e3);
  }
  runtime.world_group().broadcast(costs, 0, "pipeline partition profile");
  return {costs[0].item<double>(), costs[1].item<double>(), costs[2].item<double>()};
}

// The cost of each block and of what the first and last stages hold besides: parameters, or time.
std::vector<int64_t> stage_bounds(const Recipe& r, nn::Model& model, int64_t stages, Task& task, dist::Runtime& runtime,
                                  const c10::Device& device) {
  const auto& blocks = model.blocks();
  if (r.parallel.partition == "uniform") return parallel::uniform_partition(static_cast<int64_t>(blocks.size()), stages);
  if (r.parallel.partition == "profile") {
    const auto [block, embed, head] = profiled_costs(r, task, runtime, device);
    return parallel::balanced_partition(std::vector<double>(blocks.size(), block), embed, head, stages);
  }
  std::vector<double> cost;
  std::set<const void*> in_blocks;
  for (const auto& b : blocks) {
    double n = 0;
    for (const auto& t : b->parameters()) n += static_cast<double>(t.numel()), in_blocks.insert(t.unsafeGetTensorImpl());
    cost.push_back(n);
  }
  double first = 0, last = 0;
  const auto embedding = model.embedding_modules(), tied = model.tied_to_head();
  for (const auto& item : model.named_parameters()) {
    if (in_blocks.count(item.value().unsafeGetTensorImpl())) continue;
    const auto n = static_cast<double>(item.value().numel());
    if (in_any(item.key(), embedding)) first += n;
    if (!in_any(item.key(), embedding) || in_any(item.key(), tied)) last += n;
  }
  return parallel::balanced_partition(cost, first, last, stages);
}

}  // namespace

PipelineRunner::PipelineRunner(const Recipe& r, nn::Model& model, dist::Runtime& runtime, Task& task, const c10::Device& device)
    : pipeline_(runtime.group(dist::Dim::pp)),
      chunks_(r.parallel.virtual_stages),
      schedule_(parallel::parse_pipeline_schedule(r.parallel.schedule)),
      split_(schedule_ == parallel::PipelineSchedule::zero_bubble),
      link_(runtime.group(dist::Dim::pp), r.parallel.virtual_stages) {
  const auto embedding = model.embedding_modules();
  if (embedding.empty())
    throw Error(r.where("parallel.pipeline") + ": the " + model.model_type() + " family does not say where its embedding is, so it cannot "
                "be cut into stages (set pipeline = 1)");
  bounds_ = stage_bounds(r, model, link_.stages(), task, runtime, device);
  // Which blocks' parameters this rank holds, and the embedding and head where it runs their stages.
  std::map<const void*, int64_t> block_of;
  for (size_t b = 0; b < model.blocks().size(); ++b)
    for (const auto& t : model.blocks()[b]->parameters()) block_of[t.unsafeGetTensorImpl()] = static_cast<int64_t>(b);
  auto mine = [&](int64_t block) {
    for (int64_t c = 0; c < chunks_; ++c) {
      const int64_t s = link_.stage_of(c);
      if (block >= bounds_[static_cast<size_t>(s)] && block < bounds_[static_cast<size_t>(s) + 1]) return true;
    }
    return false;
  };
  const auto tied_modules = model.tied_to_head();
  for (auto& item : model.named_parameters()) {
    const auto it = block_of.find(item.value().unsafeGetTensorImpl());
    const bool in_embedding = in_any(item.key(), embedding), tied = in_any(item.key(), tied_modules);
    const bool holds = it != block_of.end() ? mine(it->second) : ((in_embedding && first()) || ((!in_embedding || tied) && last()));
    if (holds && item.value().requires_grad()) {
      held_.insert(item.key());
      if (tied && !(first() && last())) tied_.push_back(item.key());
    } else {
      item.value().requires_grad_(false);   // not in this rank's chunk store: deferred, never allocated
    }
  }
}

std::string PipelineRunner::describe() const {
  std::string s = "pipeline rank " + std::to_string(link_.rank()) + " of " + std::to_string(link_.ranks()) + ":";
  for (int64_t c = 0; c < chunks_; ++c) {
    const auto st = static_cast<size_t>(link_.stage_of(c));
    s += std::string(c ? "," : "") + " stage " + std::to_string(st) + " (blocks " + std::to_string(bounds_[st]) + "-" +
         std::to_string(bounds_[st + 1] - 1) + (st == 0 ? ", the embedding" : "") +
         (static_cast<int64_t>(st) == link_.stages() - 1 ? ", the head" : "") + ")";
  }
  return s + ", " + parallel::schedule_name(schedule_) + " schedule";
}

void PipelineRunner::set_port(int64_t chunk) {
  const int64_t s = link_.stage_of(chunk);
  port_->begin = bounds_[static_cast<size_t>(s)];
  port_->end = bounds_[static_cast<size_t>(s) + 1];
  port_->first = s == 0;
  port_->last = s == link_.stages() - 1;
  port_->input = at::Tensor();
  port_->output = at::Tensor();
}

namespace {

// The key two stages agree an activation's shape under: the batch's shape (the same on both).
std::string shape_key(const Batch& b, const char* phase) {
  std::string k = phase;
  for (int64_t d : b.inputs.sizes()) k += " " + std::to_string(d);
  return k;
}

}  // namespace

void PipelineRunner::forward(TrainPlan& p, const Batch& batch, int64_t micro, int64_t chunk, Held& held, int64_t micros) {
  set_port(chunk);
  const int64_t s = link_.stage_of(chunk);
  const std::string what = "micro-batch " + std::to_string(micro) + " into stage " + std::to_string(s);
  double start = clock_;
  if (!port_->first) {
    double sent = 0;
    port_->input = link_.recv_activation(s, shape_key(batch, "train"), at::TensorOptions().device(p.device), &sent,
                                         "activation of " + what + " from stage " + std::to_string(s - 1)).requires_grad_(true);
    start = std::max(start, sent);
  }
  p.strategy->before_forward();
  try {
    at::Tensor loss = p.batch_loss(p.task->loss(*p.model, batch));
    held.output = micros > 1 ? loss / static_cast<double>(micros) : loss;
  } catch (const nn::StageExit&) {
    held.output = port_->output;
    link_.send_activation(held.output, s, shape_key(batch, "train"), start + 1, "activation of micro-batch " + std::to_string(micro) +
                                                                                    " out of stage " + std::to_string(s));
  }
  clock_ = start + 1;
  held.input = port_->input;
  port_->input = port_->output = at::Tensor();
}

void PipelineRunner::backward(TrainPlan& p, int64_t micro, int64_t chunk, Held& held) {
  const int64_t s = link_.stage_of(chunk);
  double start = clock_;
  if (split_) nn::defer_weight_grads(&held.weights);   // the weights' products wait for the W pass
  try {
    if (s == link_.stages() - 1) {
      p.strategy->scale_loss(held.output).backward();
    } else {
      double sent = 0;
      const at::Tensor g = link_.recv_grad(held.output, s, &sent, "gradient of micro-batch " + std::to_string(micro) + " from stage " +
                                                                       std::to_string(s + 1) + " into stage " + std::to_string(s));
      start = std::max(start, sent);
      held.output.backward(g);
    }
  } catch (...) {
    nn::defer_weight_grads(nullptr);
    throw;
  }
  nn::defer_weight_grads(nullptr);
  clock_ = start + parallel::pass_cost(schedule_, parallel::PipelinePass::backward);
  if (s > 0) {
    const at::Tensor g = held.input.grad();
    link_.send_grad(g.defined() ? g : at::zeros_like(held.input), s, clock_,
                    "gradient of micro-batch " + std::to_string(micro) + " out of stage " + std::to_string(s));
  }
  held.input = held.output = at::Tensor();
}

at::Tensor PipelineRunner::train_step(TrainPlan& p, const std::vector<Batch>& micro) {
  const auto m = static_cast<int64_t>(micro.size());
  if (passes_micros_ != m) {   // the same every step (zero-bubble's order is searched): computed once
    passes_ = parallel::pipeline_passes(schedule_, link_.ranks(), link_.rank(), m, chunks_);
    passes_micros_ = m;
  }
  const auto& passes = passes_;
  std::vector<Held> held(static_cast<size_t>(m * chunks_));
  clock_ = 0;
  stats_ = {};
  int64_t live = 0;
  double busy = 0;
  at::Tensor loss_sum = at::zeros({}, at::TensorOptions(at::kFloat).device(p.device));
  p.strategy->before_backward(false);   // gradients accumulate over the passes; reduced once after them
  for (const auto& pass : passes) {
    Held& h = held[static_cast<size_t>(pass.micro * chunks_ + pass.chunk)];
    if (pass.kind == parallel::PipelinePass::forward) {
      forward(p, micro[static_cast<size_t>(pass.micro)], pass.micro, pass.chunk, h, m);
      if (link_.stage_of(pass.chunk) == link_.stages() - 1) loss_sum = loss_sum + h.output.detach().to(at::kFloat);
      stats_.peak_held = std::max(stats_.peak_held, ++live);
    } else if (pass.kind == parallel::PipelinePass::backward) {
      backward(p, pass.micro, pass.chunk, h);
      if (!split_) --live;
    } else {   // zero_bubble's W: the weight gradients its backward queued; nothing waits for them
      h.weights.run();
      clock_ += parallel::pass_cost(schedule_, pass.kind);
      --live;
    }
    busy += parallel::pass_cost(schedule_, pass.kind);
  }
  p.strategy->after_backward();
  link_.finish_sends();
  sum_tied_gradients(p);
  // The data-parallel reduction of the accumulated gradients, every chunk at once.
  p.strategy->before_backward(true);
  p.strategy->after_backward();
  at::Tensor span = at::full({1}, clock_, at::kDouble);
  pipeline_.all_reduce(span, dist::Reduce::max, "pipeline clock");
  stats_.idle = 1.0 - busy / span.item<double>();
  stats_.wait_s = link_.take_wait_s();
  return loss_sum;
}

void PipelineRunner::sum_tied_gradients(TrainPlan& p) {
  // The first and the last stage each hold a copy of a tied embedding: each adds the other's gradient,
  // so both updates are the one-process update and the copies stay equal.
  const int64_t peer = first() ? link_.ranks() - 1 : 0;
  const std::string other = "stage " + std::to_string(first() ? link_.stages() - 1 : 0);
  for (const auto& name : tied_) {
    at::Tensor g = p.strategy->full_grad(name);
    const at::Tensor theirs = at::empty_like(g);
    dist::Pending out = pipeline_.send_async(g.contiguous(), peer, "gradient of the tied " + name + " to " + other);
    dist::Pending in = pipeline_.recv_async(theirs, peer, "gradient of the tied " + name + " from " + other);
    pipeline_.wait(in);
    pipeline_.wait(out);
    g.add_(theirs);
  }
}

EvalSums PipelineRunner::eval(TrainPlan& p, const std::vector<Batch>& batches) {
  EvalSums sums;
  for (const Batch& b : batches)
    for (int64_t c = 0; c < chunks_; ++c) {
      set_port(c);
      const int64_t s = link_.stage_of(c);
      double sent = 0;
      if (!port_->first)
        port_->input = link_.recv_activation(s, shape_key(b, "eval"), at::TensorOptions().device(p.device), &sent,
                                             "eval activation into stage " + std::to_string(s));
      try {
        sums += p.task->eval(*p.model, b);
      } catch (const nn::StageExit&) {
        link_.send_activation(port_->output, s, shape_key(b, "eval"), 0, "eval activation out of stage " + std::to_string(s));
      }
      port_->input = port_->output = at::Tensor();
    }
  link_.finish_sends();
  return sums;
}

}  // namespace colossal
