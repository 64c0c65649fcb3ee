// Training loop: see trainer.h.
#include "src/engine/trainer.h"

#include <ATen/ATen.h>
#include <ATen/Utils.h>

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
#include "src/data/loader.h"
#include "src/data/prepare.h"
#include "src/data/token_dataset.h"
#include "src/data/tokenizer.h"
#include "src/engine/checkpoint.h"
#include "src/engine/metrics.h"
#include "src/engine/model_registry.h"
#include "src/nn/kernel_choice.h"
#include "src/io/atomic_dir.h"
#include "src/optim/adamw.h"
#include "src/optim/flat_params.h"
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

// Finetuning keeps the checkpoint's architecture; a recipe that names a different shape is an error.
ModelConfig finetune_model_config(const Recipe& r, const ModelConfig& from_ckpt, const std::string& ckpt) {
  ModelConfig m = from_ckpt;
  auto check = [&](const char* key, int64_t recipe_value, int64_t ckpt_value) {
    if (r.locations.count(std::string("model.") + key) && recipe_value != ckpt_value)
      throw RecipeError(r.where(std::string("model.") + key),
                        "= " + std::to_string(recipe_value) + " but checkpoint " + ckpt + " has " + std::to_string(ckpt_value) +
                            " (finetuning keeps the checkpoint's architecture; remove the key)");
  };
  check("n_layer", r.model.n_layer, m.n_layer);
  check("n_head", r.model.n_head, m.n_head);
  check("n_embd", r.model.n_embd, m.n_embd);
  check("block_size", r.model.block_size, m.block_size);
  check("vocab_size", r.model.vocab_size, m.vocab_size);
  m.dropout = r.model.dropout;
  return m;
}

double evaluate(nn::CausalLM& model, const std::vector<at::Tensor>& batches, const c10::Device& device) {
  if (batches.empty()) return -1.0;
  at::NoGradGuard no_grad;
  model.eval();
  double total = 0;
  for (const auto& b : batches) {
    const int64_t t = b.size(1) - 1;
    auto d = b.to(device);
    total += model.loss(d.narrow(1, 0, t), d.narrow(1, 1, t)).item<double>();
  }
  model.train();
  return total / static_cast<double>(batches.size());
}

// `r` with its [model] as training will build it (from the checkpoint when finetuning).
void print_dry_run(const Recipe& r, const c10::Device& device) {
  const ModelConfig& m = r.model;
  const int64_t params = count_parameters(m);
  auto mem = estimate_training_memory(r, params);
  std::printf("# resolved recipe (%s)\n%s\n", r.path.c_str(), r.to_toml().c_str());
  std::printf("model:       %s, %s parameters (%lld)\n", m.family.c_str(), human_count(static_cast<double>(params)).c_str(),
              static_cast<long long>(params));
  std::printf("device:      %s\n", describe_device(device).c_str());
  std::printf("tokens/step: %lld (batch %lld x seq %lld x accum %lld)\n",
              static_cast<long long>(r.train.batch_size * r.train.seq_len * r.train.grad_accum),
              static_cast<long long>(r.train.batch_size), static_cast<long long>(r.train.seq_len),
              static_cast<long long>(r.train.grad_accum));
  std::printf("memory estimate (fp32, AdamW):\n");
  std::printf("  weights     %s\n  gradients   %s\n  optimizer   %s\n  activations %s (one micro-batch)\n  total       %s\n",
              human_bytes(mem.weights).c_str(), human_bytes(mem.gradients).c_str(), human_bytes(mem.optimizer).c_str(),
              human_bytes(mem.activations).c_str(), human_bytes(mem.total()).c_str());
  const double have = static_cast<double>(physical_memory_bytes());
  std::printf("  machine     %s (%s)\n", human_bytes(have).c_str(),
              device.is_cpu() ? (mem.total() <= have ? "fits" : "does not fit: training would stop here") : "host");
}

}  // namespace

int run_training(const Recipe& recipe, const TrainOptions& opt) {
  const Recipe& r = recipe;
  const c10::Device device = resolve_device(r.train.device, r.where("train.device"));

  // Finetuning: architecture and tokenizer come from the checkpoint named by [finetune] from.
  ModelConfig model_cfg = r.model;
  std::string init_ckpt, tokenizer_path = r.data.tokenizer;
  if (opt.finetune) {
    if (r.finetune.from.empty())
      throw RecipeError(r.where("finetune.from"), "is required by `colossal finetune` (the checkpoint to start from)");
    init_ckpt = resolve_checkpoint(r.finetune.from);
    model_cfg = finetune_model_config(r, read_checkpoint_info(init_ckpt).model, init_ckpt);
    tokenizer_path = (fs::path(init_ckpt) / "tokenizer.model").string();
  }
  if (!opt.finetune && !r.sections.count("model"))
    throw RecipeError(r.path, "has no [model] section (training from scratch needs one; see recipes/gpt-mini.toml)");
  Recipe effective = r;   // with the model training builds
  effective.model = model_cfg;
  check_data_sources(effective, opt.finetune ? tokenizer_path : "");
  if (opt.dry_run) {
    print_dry_run(effective, device);
    return 0;
  }
  if (device.is_cpu()) {   // refuse before allocating anything, with the dry run's estimate
    const int64_t params = count_parameters(model_cfg);
    require_host_memory(estimate_training_memory(effective, params).total(),
                        "training this " + human_count(static_cast<double>(params)) +
                            "-parameter model (weights, gradients, AdamW state and one micro-batch's activations)");
  }

  create_output_dir(r.output.dir, r.where("output.dir"));
  set_log_file((fs::path(r.output.dir) / "train.log").string());
  spdlog::info("colossal {} {} -> {}", opt.finetune ? "finetune" : "train", r.path, r.output.dir);
  ensure_data(effective, opt.finetune ? tokenizer_path : "");
  Tokenizer tokenizer = Tokenizer::load(tokenizer_path);
  auto train_tokens = std::make_shared<const std::vector<int32_t>>(read_token_split(r.data.dataset, "train").tokens);
  const auto val_split = read_token_split(r.data.dataset, "val");
  const auto eval_set = eval_batches(val_split.tokens, r.train.batch_size, r.train.seq_len, r.train.eval_batches);
  if (eval_set.empty())
    spdlog::warn("held-out split ({} tokens) is too small for one eval batch; eval loss is skipped", val_split.tokens.size());

  nn::set_kernel_policy({nn::parse_kernel_path(r.kernels.attention), nn::parse_kernel_path(r.kernels.gelu),
                         nn::parse_kernel_path(r.kernels.gemv), nn::parse_kernel_path(r.kernels.layer_norm),
                         nn::parse_kernel_path(r.kernels.gemm)});
  at::manual_seed(static_cast<uint64_t>(r.train.seed));
  nn::LayerFactory factory;
  auto model = build_model(model_cfg, factory);
  model->to(device);
  if (opt.finetune) {
    load_model_state(*model, load_safetensors((fs::path(init_ckpt) / "model.safetensors").string()), init_ckpt);
    spdlog::info("initialised from {}", init_ckpt);
  }
  model->train();
  optim::FlatParams flat(*model, r.optim.weight_decay);
  optim::AdamW adamw(flat, {r.optim.betas[0], r.optim.betas[1], r.optim.eps});

  TrainerState state;
  if (opt.resume) {
    const std::string from = resolve_checkpoint(opt.resume_from.empty() ? r.checkpoint.dir : opt.resume_from);
    auto info = read_checkpoint_info(from);
    if (!info.has_state)
      throw Error("checkpoint " + from + ": trainer_state.json is missing, so the step, data position and schedule "
                  "cannot be resumed (to start a new run from these weights use `colossal finetune`)");
    if (info.model.n_layer != model_cfg.n_layer || info.model.n_head != model_cfg.n_head ||
        info.model.n_embd != model_cfg.n_embd || info.model.vocab_size != model_cfg.vocab_size ||
        info.model.block_size != model_cfg.block_size)
      throw Error("checkpoint " + from + " holds a different model than the recipe (resume needs the same [model])");
    if (info.tokenizer_bytes != tokenizer.model_bytes())
      throw Error("checkpoint " + from + " was trained with a different tokenizer than " + tokenizer_path);
    load_model_state(*model, load_safetensors((fs::path(from) / "model.safetensors").string()), from);
    load_optimizer_state(*model, flat, adamw, from);   // also restores the RNG state
    state = info.state;
    nn::restore_kernel_choices(state.kernel_choices);
    spdlog::info("resumed from {} at step {}", from, state.step);
  }
  create_output_dir(r.checkpoint.dir, r.where("checkpoint.dir"));   // now, not at the first save minutes in
  if (state.step >= r.train.max_steps) {
    spdlog::info("nothing to do: the checkpoint is at step {} and max_steps = {}", state.step, r.train.max_steps);
    return 0;
  }

  LoaderConfig lc{r.train.batch_size, r.train.seq_len, static_cast<uint64_t>(r.train.seed), 0, 1, r.data.prefetch};
  WindowLoader loader(train_tokens, lc, state.loader_position);
  MetricsWriter metrics((fs::path(r.output.dir) / "metrics.jsonl").string(), opt.resume);
  const int64_t params = model->parameter_count();
  const int64_t tokens_per_step = r.train.batch_size * r.train.seq_len * r.train.grad_accum;
  spdlog::info("model {}: {} parameters | device {} | {} train tokens, {} held out | {} tokens/step", model_cfg.family,
               human_count(static_cast<double>(params)), describe_device(device), human_count(static_cast<double>(train_tokens->size())),
               human_count(static_cast<double>(val_split.tokens.size())), tokens_per_step);
  metrics.write({{"event", opt.resume ? "resume" : "start"}, {"step", state.step}, {"params", params},
                 {"tokens_per_step", tokens_per_step}, {"device", device.str()}});

  auto checkpoint = [&] {
    state.kernel_choices = nn::kernel_choices();
    CheckpointSave s{model.get(), &flat, &adamw, tokenizer.model_bytes(), r.to_toml(), state};
    auto path = save_checkpoint(r.checkpoint.dir, s, r.checkpoint.keep_last);
    spdlog::info("saved checkpoint {}", path);
    return path;
  };
  auto run_eval = [&] {
    state.eval_loss = evaluate(*model, eval_set, device);
    if (state.eval_loss >= 0) {
      spdlog::info("step {}: eval loss {:.4f}", state.step, state.eval_loss);
      metrics.write({{"step", state.step}, {"eval_loss", state.eval_loss}});
    }
  };

  g_interrupted = false;
  auto old_handler = std::signal(SIGINT, on_interrupt);
  std::signal(SIGTERM, on_interrupt);
  if (!opt.resume && r.train.eval_every > 0) run_eval();   // the starting point of the eval curve

  Progress progress(r.train.max_steps, r.train.log_every, !opt.quiet);
  const auto start = Clock::now();
  constexpr int64_t kUntimedSteps = 3;   // first steps pay for allocator and thread-pool warm-up
  Clock::time_point timed_start;
  int64_t timed_steps = 0, steps_this_run = 0;
  double ema_tokens_per_s = 0, ema_step_s = 0;
  std::string last_saved;

  while (state.step < r.train.max_steps) {
    const auto t0 = Clock::now();
    const double lr = optim::lr_at(r.optim, state.step);
    at::Tensor step_loss;   // summed on the device: one host sync per step, not one per micro-batch
    for (int64_t micro = 0; micro < r.train.grad_accum; ++micro) {
      auto batch = loader.next().to(device);   // [B, T+1]
      const int64_t t = batch.size(1) - 1;
      auto loss = model->loss(batch.narrow(1, 0, t), batch.narrow(1, 1, t));
      if (r.train.grad_accum > 1) loss = loss / static_cast<double>(r.train.grad_accum);
      loss.backward();
      step_loss = micro == 0 ? loss.detach() : step_loss + loss.detach();
    }
    const double loss_sum = step_loss.item<double>();
    if (!std::isfinite(loss_sum))
      throw Error("loss became " + std::to_string(loss_sum) + " at step " + std::to_string(state.step + 1) +
                  " (lower optim.lr or set train.grad_clip; the last checkpoint is intact)");
    const double grad_norm = flat.clip_grad_norm(r.train.grad_clip);
    adamw.step(lr);
    flat.zero_grad();

    ++state.step;
    ++steps_this_run;
    state.loader_position = loader.position();
    state.tokens_seen += tokens_per_step;
    state.train_loss = loss_sum;
    const double step_s = seconds_since(t0);
    if (steps_this_run == kUntimedSteps) timed_start = Clock::now();
    if (steps_this_run > kUntimedSteps) ++timed_steps;
    const double tps = static_cast<double>(tokens_per_step) / step_s;
    ema_tokens_per_s = ema_tokens_per_s == 0 ? tps : 0.9 * ema_tokens_per_s + 0.1 * tps;
    ema_step_s = ema_step_s == 0 ? step_s : 0.9 * ema_step_s + 0.1 * step_s;
    const size_t mem = device.is_cpu() ? current_rss_bytes() : device_allocated_bytes(device);
    metrics.write({{"step", state.step}, {"loss", loss_sum}, {"lr", lr}, {"grad_norm", grad_norm},
                   {"tokens_per_s", tps}, {"step_ms", step_s * 1e3}, {"mem_mb", static_cast<double>(mem) / 1048576.0}});
    double eta = ema_step_s * static_cast<double>(r.train.max_steps - state.step);
    if (r.train.time_limit_min > 0) eta = std::min(eta, r.train.time_limit_min * 60 - seconds_since(start));
    progress.update(state.step, loss_sum, lr, ema_tokens_per_s, eta, mem);

    const bool last = state.step == r.train.max_steps;
    if (r.train.eval_every > 0 && state.step % r.train.eval_every == 0 && !last) run_eval();
    if (r.checkpoint.every > 0 && state.step % r.checkpoint.every == 0 && !last) last_saved = checkpoint();
    if (g_interrupted || (r.train.time_limit_min > 0 && seconds_since(start) >= r.train.time_limit_min * 60)) {
      if (g_interrupted) spdlog::warn("interrupted at step {}: saving and stopping (continue with --resume)", state.step);
      else spdlog::info("time limit of {} min reached at step {}", r.train.time_limit_min, state.step);
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
  last_saved = checkpoint();
  const double wall = seconds_since(start);
  const double steady_tps = static_cast<double>(counted_steps * tokens_per_step) / counted_s;
  const auto peak_rss = static_cast<double>(peak_rss_bytes()), peak_device = static_cast<double>(device_peak_allocated_bytes(device));
  nlohmann::json summary = {{"steps", state.step},
                            {"steps_this_run", steps_this_run},
                            {"tokens_per_s", steady_tps},
                            {"peak_rss_mb", peak_rss / 1048576.0},
                            {"peak_device_mb", peak_device / 1048576.0},
                            {"final_loss", state.train_loss},
                            {"final_eval_loss", state.eval_loss},
                            {"params", params},
                            {"wall_s", wall},
                            {"checkpoint", last_saved}};
  write_file_atomic((fs::path(r.output.dir) / "summary.json").string(), summary.dump(2) + "\n");
  metrics.write({{"event", "end"}, {"step", state.step}, {"eval_loss", state.eval_loss}, {"tokens_per_s", steady_tps}});
  const std::string peak_mem = device.is_cpu() ? human_bytes(peak_rss)
                                               : fmt::format("{} {}, {} host", human_bytes(peak_device), device.str(), human_bytes(peak_rss));
  const std::string done = fmt::format("done: {} steps in {} | loss {:.4f} | eval loss {:.4f} | {} tok/s | peak mem {} | checkpoint {}",
                                       state.step, human_duration(wall), state.train_loss, state.eval_loss,
                                       human_count(steady_tps), peak_mem, last_saved);
  if (opt.quiet) std::fprintf(stderr, "%s\n", done.c_str());   // the one line a quiet run prints
  else spdlog::info("{}", done);
  return g_interrupted ? 130 : 0;
}

}  // namespace colossal
