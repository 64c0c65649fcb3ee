// Training loop: see trainer.h.
#include "src/engine/trainer.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/Utils.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include "src/core/device.h"
#include "src/core/error.h"
#include "src/core/log.h"
#include "src/core/progress.h"
#include "src/core/text.h"
#include "src/engine/activation_plan.h"
#include "src/engine/checkpoint.h"
#include "src/engine/metrics.h"
#include "models/registry.h"
#include "src/engine/train_plan.h"
#include "src/dist/launch_env.h"
#include "src/dist/mesh.h"
#include "src/dist/runtime.h"
#include "src/nn/kernel_choice.h"
#include "src/io/atomic_dir.h"
#include "src/engine/memory_profile.h"
#include "src/memory/allocation_counter.h"
#include "src/memory/host_heap.h"
#include "src/memory/offload_file.h"
#include "src/optim/schedule.h"

namespace fs = std::filesystem;

namespace colossal {
namespace {

// The first Ctrl-C (or SIGTERM) asks the loop to save and stop after the current step. A second one
// stops at once: a step can take minutes on a large recipe, and checkpoints are written to a temporary
// directory and renamed, so ending mid-save leaves the last complete checkpoint and `latest` as they are.
std::atomic<bool> g_interrupted{false};
extern "C" void on_interrupt(int) {
  if (g_interrupted.exchange(true)) {
    static const char kMsg[] = "\ninterrupted again: stopping now; the last complete checkpoint is unchanged\n";
    [[maybe_unused]] auto n = write(STDERR_FILENO, kMsg, sizeof kMsg - 1);
    _exit(130);
  }
  static const char kMsg[] = "\ninterrupted: saving after this step (Ctrl-C again to stop at once, without saving)\n";
  [[maybe_unused]] auto n = write(STDERR_FILENO, kMsg, sizeof kMsg - 1);
}

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The task's eval metric over every rank's share of the held-out batches.
EvalResult evaluate(TrainPlan& p) {
  at::NoGradGuard no_grad;
  p.model->eval();
  p.strategy->before_forward();
  EvalSums local;
  if (p.pipeline) {   // through the stages: the last one's sums, zero elsewhere
    std::vector<Batch> parts;
    for (const auto& b : p.task->eval_set()) parts.push_back(p.local_part(b.to(p.device)));
    local = p.pipeline->eval(p, parts);
  } else {
    for (const auto& b : p.task->eval_set()) local += p.task->eval(*p.model, p.local_part(b.to(p.device)));
  }
  p.model->train();
  at::Tensor sums = at::tensor({local.loss, local.batches, local.correct, local.scored}, at::kDouble);
  p.runtime->replicas().all_reduce(sums, dist::Reduce::sum, "eval metrics");
  for (dist::Group* g : p.row_groups) g->all_reduce(sums, dist::Reduce::sum, "eval metrics");   // each row block's
  p.runtime->group(dist::Dim::pp).all_reduce(sums, dist::Reduce::sum, "eval metrics");   // the last stage's
  const auto v = [&](int i) { return sums[i].item<double>(); };
  EvalResult r;
  if (v(1) > 0) r.loss = v(0) / v(1);
  if (p.task->has_accuracy() && v(3) > 0) r.accuracy = v(2) / v(3);
  return r;
}

// `r` with its [model] as training will build it (from the checkpoint when finetuning).
void print_dry_run(const Recipe& r, const c10::Device& device, int64_t launch_world) {
  const ModelConfig& m = r.model;
  // The plan's disk tier, checked as the run checks it before training (an error before any output).
  const double free_bytes = r.memory.offload_optimizer == "nvme"
                                ? static_cast<double>(memory::offload_dir_free_bytes(r.memory.nvme_path, "nvme_path " + r.memory.nvme_path))
                                : 0.0;
  const int64_t params = count_parameters(m);
  std::printf("# resolved recipe (%s)\n%s\n", r.path.c_str(), r.to_toml().c_str());
  std::printf("model:       %s, %s parameters (%lld)\n", m.family.c_str(), human_count(static_cast<double>(params)).c_str(),
              static_cast<long long>(params));
  std::printf("device:      %s\n", describe_device(device).c_str());
  dist::WorkerEnv env = dist::worker_env(dist::process_env());
  if (launch_world > 0) {
    env.world = launch_world;
    env.source = "launcher";
  }
  const dist::MeshShape mesh = check_parallel_recipe(r, env.world);
  std::printf("parallel:    %lld rank(s) (%s), mesh %s, %s backend\n", static_cast<long long>(env.world), env.source.c_str(),
              mesh.describe().c_str(), r.parallel.backend.c_str());
  const int64_t dp = mesh.of(dist::Dim::dp);
  std::printf("tokens/step: %lld (batch %lld x seq %lld x accum %lld x data-parallel %lld)\n",
              static_cast<long long>(r.train.batch_size * tokens_per_sample(r) * r.train.grad_accum * dp),
              static_cast<long long>(r.train.batch_size), static_cast<long long>(tokens_per_sample(r)),
              static_cast<long long>(r.train.grad_accum), static_cast<long long>(dp));
  const auto mem = estimate_training_memory(r, params, dp);
  const int64_t workers = launch_world > 0 ? launch_world : env.local_world;   // processes on this machine
  const std::string precision = r.precision.dtype == "fp32" ? "fp32" : r.precision.dtype + " with fp32 master weights";
  std::printf("memory per rank (%s, %s, ZeRO stage %lld over %lld data-parallel rank(s)):\n", precision.c_str(), r.optim.name.c_str(),
              static_cast<long long>(r.memory.zero), static_cast<long long>(dp));
  std::printf("  weights     %s\n  gradients   %s\n  optimizer   %s\n  activations %s (one micro-batch)\n  total       %s\n",
              human_bytes(mem.weights).c_str(), human_bytes(mem.gradients).c_str(), human_bytes(mem.optimizer).c_str(),
              human_bytes(mem.activations).c_str(), human_bytes(mem.total()).c_str());
  if (r.memory.offload_optimizer == "nvme") {
    const double disk = mem.nvme * static_cast<double>(workers);
    std::printf("  nvme        %s optimizer states%s%s in %s (%s free: %s)\n", human_bytes(mem.nvme).c_str(),
                r.memory.offload_params == "nvme" ? " and parameters (fp32 master)" : r.precision.dtype == "fp32" ? "" : " and master weights",
                workers > 1 ? (" per rank, " + human_bytes(disk) + " in all").c_str() : "", r.memory.nvme_path.c_str(),
                human_bytes(free_bytes).c_str(), disk <= free_bytes ? "fits" : "does not fit: training would stop here");
  }
  if (r.memory.device_memory_limit_gb > 0) {   // what check_device_budget holds the run to
    const double budget = r.memory.device_limit_bytes(), least = minimum_device_bytes(r, params, dp);
    std::printf("  device      at least %s of the budget of %s (placement %s: %s)\n", human_bytes(least).c_str(), human_bytes(budget).c_str(),
                r.memory.placement.c_str(), least <= budget ? "fits" : "does not fit: training would stop here");
  }
  if (r.memory.activation_checkpoint == "auto") {   // the choice from the shape (the run measures each block)
    const auto plan = choose_recompute(r, estimate_block_activations(r), "estimated from the shape");
    std::printf("  recompute   auto: %s (estimated from the shape; the run measures each block and may choose otherwise)\n",
                describe_recompute(r, plan).c_str());
  } else if (r.memory.activation_checkpoint != "none") {
    const auto mask = fixed_recompute_mask(r.memory, r.model.n_layer);
    std::printf("  recompute   %s: %lld of %lld blocks\n", r.memory.activation_checkpoint.c_str(),
                static_cast<long long>(std::count(mask.begin(), mask.end(), true)), static_cast<long long>(r.model.n_layer));
  }
  const double have = static_cast<double>(physical_memory_bytes()), need = mem.total() * static_cast<double>(workers);
  const std::string here = workers > 1 ? " for its " + std::to_string(workers) + " ranks (" + human_bytes(need) + ")" : "";
  std::printf("  machine     %s (%s)\n", human_bytes(have).c_str(),
              device.is_cpu() ? (need <= have ? "fits" + here : "does not fit" + here + ": training would stop here").c_str() : "host");
}


// The agreed end-of-step facts: every rank must take the same branch (stop, save, fail on a
// non-finite loss), so the decision is reduced across the job rather than read from local state.
struct StepAgreement {
  double loss = 0;    // mean over the data-parallel ranks of this step's loss (the last pipeline stage's)
  bool stop = false;  // some rank was interrupted or reached the time limit
};
StepAgreement agree(TrainPlan& p, double local_loss, bool local_stop) {
  at::Tensor v = at::tensor({local_loss, local_stop ? 1.0 : 0.0}, at::kDouble);
  p.runtime->world_group().all_reduce(v, dist::Reduce::sum, "step agreement");
  const int64_t with_loss = p.runtime->world() / p.runtime->group(dist::Dim::pp).size();   // a pipeline's last stage alone has one
  return {v[0].item<double>() / static_cast<double>(with_loss), v[1].item<double>() > 0};
}

// Every rank's resident memory in MiB: before the model was built, at its peak once the weights were in
// place, and at its peak over the run (summary.json's "rss_mb"; a collective on every rank). The
// growth from the first to the second is what holding this rank's part of the model cost it.
nlohmann::json rank_memory(TrainPlan& p, double peak_rss) {
  dist::Group& world = p.runtime->world_group();
  at::Tensor t = at::zeros({3, world.size()}, at::kDouble);
  const int64_t me = world.rank();
  t[0][me] = static_cast<double>(p.rss_before_model) / 1048576.0;
  t[1][me] = static_cast<double>(p.peak_rss_after_setup) / 1048576.0;
  t[2][me] = peak_rss / 1048576.0;
  if (world.active()) world.all_reduce(t, dist::Reduce::sum, "memory report");
  auto row = [&](int64_t i) {
    std::vector<double> v(static_cast<size_t>(world.size()));
    for (int64_t k = 0; k < world.size(); ++k) v[static_cast<size_t>(k)] = t[i][k].item<double>();
    return v;
  };
  return {{"before_model", row(0)}, {"after_setup_peak", row(1)}, {"peak", row(2)}};
}

// `colossal profile`'s outputs: the table on the console, profile.json and profile.html in profile_out.
void write_profile(TrainPlan& p) {
  const std::string& dir = p.options.profile_out;
  fs::create_directories(dir);
  const std::string title = p.recipe.path + ": " + p.recipe.model.family + ", " + human_count(static_cast<double>(p.model->parameter_count())) +
                            " parameters, " + p.strategy->describe();
  nlohmann::json profile = memory_profile_json(p.strategy->store(), *p.tracer, title);
  if (p.recompute_plan) {   // activation_checkpoint = "auto": what it measured and chose
    profile["activation_checkpoint"] = {{"recompute", p.recompute_plan->recompute}, {"predicted_bytes", p.recompute_plan->peak},
                                        {"target_bytes", p.recipe.memory.activation_memory_gb * 1073741824.0},
                                        {"rerun_s", p.recompute_plan->seconds}};
  }
  write_file_atomic((fs::path(dir) / "profile.json").string(), profile.dump(1) + "\n");
  write_file_atomic((fs::path(dir) / "profile.html").string(), memory_profile_html(profile));
  std::printf("%s", memory_profile_table(profile).c_str());
  if (p.recompute_plan) std::printf("activation checkpointing auto: %s\n", describe_recompute(p.recipe, *p.recompute_plan).c_str());
  std::printf("wrote %s/profile.json and %s/profile.html\n", dir.c_str(), dir.c_str());
  std::fflush(stdout);
}

int run_loop(TrainPlan& p) {
  const Recipe& r = p.recipe;
  const TrainOptions& opt = p.options;
  TrainerState& state = p.state;
  const bool root = p.is_root();
  dist::Runtime& rt = *p.runtime;
  if (state.step >= r.train.max_steps) {
    spdlog::info("nothing to do: the checkpoint is at step {} and max_steps = {}", state.step, r.train.max_steps);
    return 0;
  }
  Task& task = *p.task;
  task.start(state.samples_seen);
  std::unique_ptr<MetricsWriter> metrics;
  if (root) metrics = std::make_unique<MetricsWriter>((fs::path(r.output.dir) / "metrics.jsonl").string(), opt.resume);
  auto write_metrics = [&](const nlohmann::json& j) {
    if (metrics) metrics->write(j);
  };
  const int64_t params = count_parameters(r.model);   // the whole model's (a tensor-parallel rank holds a piece)
  const int64_t tokens_per_step = p.tokens_per_step();
  spdlog::info("model {}: {} parameters | device {} | {}: {} | {} tokens/step{}", r.model.family,
               human_count(static_cast<double>(params)), describe_device(p.device), task.name(), task.describe_data(),
               tokens_per_step, rt.world() > 1 ? fmt::format(" | {} ranks", rt.world()) : std::string());
  write_metrics({{"event", opt.resume ? "resume" : "start"}, {"step", state.step}, {"params", params},
                 {"tokens_per_step", tokens_per_step}, {"device", p.device.str()}, {"world_size", rt.world()}});
  if (p.recompute_plan) {   // activation_checkpoint = "auto": the choice, its prediction, and keeping every block's
    const auto& plan = *p.recompute_plan;
    write_metrics({{"step", state.step}, {"recomputed_blocks", plan.count()}, {"predicted_activation_mb", plan.peak / 1048576.0},
                   {"activation_mb_kept_whole", plan.kept_whole / 1048576.0}});
  }

  // Every rank reaches the save: rank 0 alone writes when it holds all the state (ZeRO 0), every rank
  // its own share under ZeRO 1-3; `latest` moves only once every rank's files are on disk.
  auto checkpoint = [&] {
    rt.world_group().barrier("before the checkpoint at step " + std::to_string(state.step));
    state.kernel_choices = nn::kernel_choices();
    state.world_size = p.dp_size;
    CheckpointSave s{p.model.get(), p.strategy.get(), &rt.replicas(), task.tokenizer_files(), r.to_toml(), state, p.base_config};
    s.tensor_group = &rt.group(dist::Dim::tp);
    if (p.pipeline) {   // each stage writes its parameters; the first stage a tied embedding
      s.pipeline_group = &rt.group(dist::Dim::pp);
      s.holds = [&p](const std::string& name) { return p.pipeline->holds(name); };
      if (!p.pipeline->first()) s.copies = p.pipeline->tied();
    }
    const std::string path = save_checkpoint(r.checkpoint.dir, s, r.checkpoint.keep_last);
    if (root) spdlog::info("saved checkpoint {}", path);
    return path;
  };
  auto run_eval = [&] {
    const EvalResult e = evaluate(p);
    state.eval_loss = e.loss;
    state.eval_accuracy = e.accuracy;
    if (e.loss < 0) return;
    nlohmann::json record = {{"step", state.step}, {"eval_loss", e.loss}};
    if (e.accuracy >= 0) record["eval_accuracy"] = e.accuracy;
    write_metrics(record);
    if (e.accuracy >= 0) spdlog::info("step {}: eval loss {:.4f}, accuracy {:.2f}%", state.step, e.loss, 100 * e.accuracy);
    else spdlog::info("step {}: eval loss {:.4f}", state.step, e.loss);
  };

  g_interrupted = false;
  auto old_handler = std::signal(SIGINT, on_interrupt);
  std::signal(SIGTERM, on_interrupt);
  if (!opt.resume && r.train.eval_every > 0) run_eval();   // the starting point of the eval curve

  Progress progress(r.train.max_steps, r.train.log_every, !opt.quiet && root);
  const auto start = Clock::now();
  constexpr int64_t kUntimedSteps = 3;   // first steps pay for allocator and thread-pool warm-up
  Clock::time_point timed_start;
  int64_t timed_steps = 0, steps_this_run = 0;
  double ema_tokens_per_s = 0, ema_step_s = 0, dp_busy_s = 0, dp_wait_s = 0;
  std::string last_saved;
  rt.take_counters();   // setup traffic (parameter broadcast, eval) is not a step's

  // `colossal profile` traces the last step; the ones before it warm up (allocator, kernel choices).
  memory::MemoryTracer* tracer = p.tracer.get();
  auto mark = [tracer](const char* phase) {
    if (tracer) tracer->mark(phase);
  };
  while (state.step < r.train.max_steps) {
    const auto t0 = Clock::now();
    const double lr = optim::lr_at(r.optim, state.step);
    if (tracer && state.step + 1 == r.train.max_steps) tracer->begin();
    // what ATen holds on this thread when the step starts, and a new peak interval from there
    const int64_t held_before = p.counter ? p.counter->live() : 0;
    if (p.counter) p.counter->take_peak(memory::AllocationCounter::step);
    at::Tensor step_loss;   // summed on the device: one host sync per step, not one per micro-batch
    if (p.pipeline) {   // the schedule runs the micro-batches' forwards and backwards across the stages
      std::vector<Batch> micro;
      for (int64_t k = 0; k < r.train.grad_accum; ++k) micro.push_back(p.local_part(task.next().to(p.device)));
      step_loss = p.pipeline->train_step(p, micro);
    } else {
      for (int64_t micro = 0; micro < r.train.grad_accum; ++micro) {
        const Batch batch = p.local_part(task.next().to(p.device));   // this rank's tokens when the sequence is split
        mark("forward");
        p.strategy->before_forward();
        p.strategy->before_backward(micro == r.train.grad_accum - 1);   // the step's gradients are complete after the last
        auto loss = p.batch_loss(task.loss(*p.model, batch));
        if (r.train.grad_accum > 1) loss = loss / static_cast<double>(r.train.grad_accum);
        mark("backward");
        p.strategy->scale_loss(loss).backward();   // fp16: scaled so small gradients survive its range
        p.strategy->after_backward();
        step_loss = micro == 0 ? loss.detach() : step_loss + loss.detach();
      }
    }
    mark("update");
    // Every rank now holds the average gradient (or, sharded, its part of it).
    const bool time_up = r.train.time_limit_min > 0 && seconds_since(start) >= r.train.time_limit_min * 60;
    const StepAgreement agreed = agree(p, step_loss.item<double>(), g_interrupted || time_up);
    const double loss_sum = agreed.loss;
    if (!std::isfinite(loss_sum))
      throw Error("loss became " + std::to_string(loss_sum) + " at step " + std::to_string(state.step + 1) +
                  " (lower optim.lr or set train.grad_clip; the last checkpoint is intact)");
    // Global norm (gradients are already averaged), clipping, the update; fp16 skips an overflowed step.
    const auto report = p.strategy->optimizer_step(lr, r.train.grad_clip);
    mark("step end");
    if (tracer) tracer->end();
    const double grad_norm = report.grad_norm;
    if (report.skipped)
      spdlog::debug("step {}: gradients overflowed fp16; skipped, loss scale now {}", state.step + 1, p.strategy->loss_scale());

    ++state.step;
    ++steps_this_run;
    state.samples_seen = task.position();
    state.tokens_seen += tokens_per_step;
    state.train_loss = loss_sum;
    const double step_s = seconds_since(t0);
    // The first step timed nearly every shape: kept now, so a run stopped early still leaves them.
    if (steps_this_run == 1 && p.kernel_cache) p.kernel_cache->save();
    if (steps_this_run == kUntimedSteps) timed_start = Clock::now();
    if (steps_this_run > kUntimedSteps) ++timed_steps;
    const double tps = static_cast<double>(tokens_per_step) / step_s;
    ema_tokens_per_s = ema_tokens_per_s == 0 ? tps : 0.9 * ema_tokens_per_s + 0.1 * tps;
    ema_step_s = ema_step_s == 0 ? step_s : 0.9 * ema_step_s + 0.1 * step_s;
    const size_t mem = p.device.is_cpu() ? current_rss_bytes() : device_allocated_bytes(p.device);
    const dist::CommCounters dp_comm = rt.replicas().take_counters();   // gradient reduction (dp, and sp when split)
    dist::CommCounters tp_comm = rt.group(dist::Dim::tp).take_counters();
    for (size_t a = 0; a < rt.tensor_axes(); ++a) tp_comm += rt.tensor_axis(a).take_counters();   // 2d's row and column traffic
    const dist::CommCounters all_comm = rt.take_counters();
    if (steps_this_run > kUntimedSteps) {
      dp_busy_s += dp_comm.busy_s;
      dp_wait_s += dp_comm.wait_s;
    }
    nlohmann::json record = {{"step", state.step}, {"loss", loss_sum}, {"lr", lr}, {"grad_norm", grad_norm},
                             {"tokens_per_s", tps}, {"step_ms", step_s * 1e3}, {"mem_mb", static_cast<double>(mem) / 1048576.0},
                             {"update_ms", report.update_s * 1e3}, {"norm_ms", report.norm_s * 1e3}};   // norm, clipping and update
    if (report.overlapped)   // the last update ran beside this step's forward: what the forward waited for it
      record["update_wait_ms"] = report.update_wait_s * 1e3;
    if (r.memory.offload_optimizer == "nvme") {   // rank 0's offload file during the update
      record["nvme_read_mb"] = static_cast<double>(report.nvme_read) / 1048576.0;
      record["nvme_write_mb"] = static_cast<double>(report.nvme_written) / 1048576.0;
    }
    if (r.precision.dtype == "fp16") {   // the scale this step's loss used, and the overflowed steps so far
      record["loss_scale"] = report.loss_scale;
      record["skipped"] = report.skipped;
      record["skipped_steps"] = p.strategy->skipped_steps();
    }
    if (p.counter)   // tensors the step added at its peak (activations, gradients, the update's temporaries): exact bytes
      record["tensor_peak_mb"] = static_cast<double>(p.counter->take_peak(memory::AllocationCounter::step) - held_before) / 1048576.0;
    if (report.device_peak > 0) {   // a device budget (placement): the step's largest window, and what kept it within
      record["device_peak_mb"] = static_cast<double>(report.device_peak) / 1048576.0;
      record["evictions"] = report.evictions;
    }
    if (p.pipeline) {   // this rank's bubble: in schedule units (forward 1, backward 2) and receive-blocked wall time
      const auto& ps = p.pipeline->last_step();
      record["pipeline_idle"] = ps.idle;
      record["pipeline_wait_ms"] = ps.wait_s * 1e3;
      record["pipeline_peak_micro_batches"] = ps.peak_held;
    }
    if (rt.world_group().active()) {
      dist::CommCounters total = dp_comm;
      total += tp_comm;
      total += all_comm;
      if (rt.group(dist::Dim::tp).active()) {   // the tensor-parallel layers' collectives (and the loss's)
        record["tp_comm_calls"] = tp_comm.calls;
        record["tp_comm_mb"] = static_cast<double>(tp_comm.bytes) / 1048576.0;
      }
      record["comm_calls"] = total.calls;
      record["comm_mb"] = static_cast<double>(total.bytes) / 1048576.0;
      record["dp_allreduce_ms"] = dp_comm.busy_s * 1e3;   // gradient buckets, launch to completion
      record["dp_exposed_ms"] = dp_comm.wait_s * 1e3;     // of which the step waited for
    }
    write_metrics(record);
    double eta = ema_step_s * static_cast<double>(r.train.max_steps - state.step);
    if (r.train.time_limit_min > 0) eta = std::min(eta, r.train.time_limit_min * 60 - seconds_since(start));
    progress.update(state.step, loss_sum, lr, ema_tokens_per_s, eta, mem);

    const bool last = state.step == r.train.max_steps;
    if (r.train.eval_every > 0 && state.step % r.train.eval_every == 0 && !last) run_eval();
    if (r.checkpoint.every > 0 && state.step % r.checkpoint.every == 0 && (!last || !r.checkpoint.at_end)) last_saved = checkpoint();
    if (agreed.stop) {
      if (g_interrupted) spdlog::warn("interrupted at step {}: saving and stopping (continue with --resume)", state.step);
      else if (time_up) spdlog::info("time limit of {} min reached at step {}", r.train.time_limit_min, state.step);
      else spdlog::info("stopping at step {}: another rank was interrupted or reached the time limit", state.step);
      break;
    }
  }
  // Steady state = the steps after the untimed ones, or the whole loop if it never got past them;
  // measured here, before the final eval and save.
  const int64_t counted_steps = timed_steps > 0 ? timed_steps : steps_this_run;
  const double counted_s = seconds_since(timed_steps > 0 ? timed_start : start);
  progress.finish();
  std::signal(SIGINT, old_handler);
  std::signal(SIGTERM, SIG_DFL);

  run_eval();
  if (r.checkpoint.at_end) last_saved = checkpoint();
  if (tracer && root) write_profile(p);
  const double wall = seconds_since(start);
  const double steady_tps = static_cast<double>(counted_steps * tokens_per_step) / counted_s;
  const auto peak_rss = static_cast<double>(peak_rss_bytes()), peak_device = static_cast<double>(device_peak_allocated_bytes(p.device));
  const nlohmann::json rank_rss = rank_memory(p, peak_rss);   // collective
  if (!root) return g_interrupted ? 130 : 0;
  nlohmann::json summary = {{"steps", state.step},
                            {"steps_this_run", steps_this_run},
                            {"tokens_per_s", steady_tps},
                            {"peak_rss_mb", peak_rss / 1048576.0},
                            {"peak_device_mb", peak_device / 1048576.0},
                            {"rss_mb", rank_rss},
                            {"final_loss", state.train_loss},
                            {"final_eval_loss", state.eval_loss},
                            {"task", task.name()},
                            {"params", params},
                            {"world_size", rt.world()},
                            {"wall_s", wall},
                            {"checkpoint", last_saved}};
  if (rt.world_group().active() && dp_busy_s > 0) {
    summary["dp_allreduce_s"] = dp_busy_s;
    summary["dp_exposed_s"] = dp_wait_s;
    summary["dp_hidden_fraction"] = std::max(0.0, 1.0 - dp_wait_s / dp_busy_s);
  }
  if (state.eval_accuracy >= 0) summary["final_eval_accuracy"] = state.eval_accuracy;
  const memory::ChunkBytes held = p.strategy->store().bytes();   // rank 0's, by the chunk store
  summary["zero_stage"] = r.memory.zero;
  summary["held_mb"] = {{"params", static_cast<double>(held.params) / 1048576.0}, {"grads", static_cast<double>(held.grads) / 1048576.0},
                        {"optimizer", static_cast<double>(held.optimizer) / 1048576.0}, {"of_which_host", static_cast<double>(held.host) / 1048576.0}};
  if (r.precision.dtype == "fp16") summary["skipped_steps"] = p.strategy->skipped_steps();
  write_file_atomic((fs::path(r.output.dir) / "summary.json").string(), summary.dump(2) + "\n");
  write_metrics({{"event", "end"}, {"step", state.step}, {"eval_loss", state.eval_loss}, {"tokens_per_s", steady_tps}});
  const std::string peak_mem = p.device.is_cpu() ? human_bytes(peak_rss)
                                                 : fmt::format("{} {}, {} host", human_bytes(peak_device), p.device.str(), human_bytes(peak_rss));
  const std::string ranks = rt.world() > 1 ? fmt::format(" | {} ranks", rt.world()) : std::string();
  const std::string accuracy = state.eval_accuracy >= 0 ? fmt::format(" | eval accuracy {:.2f}%", 100 * state.eval_accuracy) : "";
  const std::string done = fmt::format("done: {} steps in {} | loss {:.4f} | eval loss {:.4f}{} | {} tok/s{} | peak mem {} | checkpoint {}",
                                       state.step, human_duration(wall), state.train_loss, state.eval_loss, accuracy,
                                       human_count(steady_tps), ranks, peak_mem, last_saved.empty() ? "none" : last_saved);
  if (opt.quiet) std::fprintf(stderr, "%s\n", done.c_str());   // the one line a quiet run prints
  else spdlog::info("{}", done);
  return g_interrupted ? 130 : 0;
}

}  // namespace

int run_training(const Recipe& recipe, const TrainOptions& opt) {
  const EffectiveRecipe effective = effective_recipe(recipe, opt);
  if (opt.dry_run) {
    const Recipe& r = effective.recipe;
    print_dry_run(r, resolve_device(r.train.device, r.where("train.device")), opt.launch_world);
    return 0;
  }
  // Before the model is built: its steps' activations then come back from the heap instead of the kernel.
  if (!memory::keep_freed_host_memory()) spdlog::debug("the C library kept its own heap thresholds");
  auto plan = build_plan(effective, opt);
  return run_loop(*plan);
}

}  // namespace colossal
