// Pipeline schedules: see pipeline_schedule.h.
#include "src/parallel/pipeline_schedule.h"

#include <algorithm>

#include "src/core/error.h"

namespace colossal::parallel {

PipelineSchedule parse_pipeline_schedule(const std::string& name) {
  if (name == "gpipe") return PipelineSchedule::gpipe;
  if (name == "1f1b") return PipelineSchedule::one_f_one_b;
  if (name == "interleaved") return PipelineSchedule::interleaved;
  if (name == "zero_bubble") return PipelineSchedule::zero_bubble;
  throw Error("pipeline schedule \"" + name + "\" (valid: gpipe, 1f1b, interleaved, zero_bubble)");
}

const char* schedule_name(PipelineSchedule s) {
  switch (s) {
    case PipelineSchedule::gpipe: return "gpipe";
    case PipelineSchedule::one_f_one_b: return "1f1b";
    case PipelineSchedule::interleaved: return "interleaved";
    case PipelineSchedule::zero_bubble: return "zero_bubble";
  }
  return "?";
}

namespace {

using Kind = PipelinePass::Kind;

// Megatron's order of one rank's forward (or backward) passes over its chunks: micro-batches in groups
// of P, each group through chunk 0, 1, ... (backward: the last chunk first).
PipelinePass interleaved_pass(Kind kind, int64_t k, int64_t ranks, int64_t chunks) {
  const int64_t group = k / (ranks * chunks), in_group = k % (ranks * chunks);
  const int64_t chunk = in_group / ranks;
  return {kind, group * ranks + in_group % ranks, kind == Kind::forward ? chunk : chunks - 1 - chunk};
}

}  // namespace

std::vector<PipelinePass> pipeline_passes(PipelineSchedule s, int64_t ranks, int64_t rank, int64_t micros, int64_t chunks) {
  if (ranks < 1 || rank < 0 || rank >= ranks || micros < 1 || chunks < 1)
    throw Error("pipeline schedule: rank " + std::to_string(rank) + " of " + std::to_string(ranks) + ", " + std::to_string(micros) +
                " micro-batches, " + std::to_string(chunks) + " chunks (internal)");
  std::vector<PipelinePass> out;
  if (s == PipelineSchedule::zero_bubble) throw Error("pipeline schedule zero_bubble is not built yet (use 1f1b or interleaved)");
  if (s != PipelineSchedule::interleaved && chunks != 1) throw Error("pipeline schedule: several chunks a rank need interleaved (internal)");
  if (s == PipelineSchedule::gpipe) {
    for (int64_t m = 0; m < micros; ++m) out.push_back({Kind::forward, m, 0});
    for (int64_t m = 0; m < micros; ++m) out.push_back({Kind::backward, m, 0});
    return out;
  }
  if (s == PipelineSchedule::interleaved && micros % ranks != 0)
    throw Error("interleaved schedule: " + std::to_string(micros) + " micro-batches are not groups of " + std::to_string(ranks) + " (internal)");
  // 1f1b is interleaving with one chunk: the fill is P - r - 1 forwards either way.
  const int64_t total = micros * chunks;
  int64_t warmup = micros == ranks && chunks > 1 ? total   // Megatron's rule: with M = P every forward comes first
                                                  : (ranks - rank - 1) * (chunks > 1 ? 2 : 1) + (chunks - 1) * ranks;
  warmup = std::min(warmup, total);
  auto pass = [&](Kind kind, int64_t k) {
    return chunks == 1 ? PipelinePass{kind, k, 0} : interleaved_pass(kind, k, ranks, chunks);
  };
  for (int64_t k = 0; k < warmup; ++k) out.push_back(pass(Kind::forward, k));
  for (int64_t k = 0; k < total - warmup; ++k) {
    out.push_back(pass(Kind::forward, warmup + k));
    out.push_back(pass(Kind::backward, k));
  }
  for (int64_t k = total - warmup; k < total; ++k) out.push_back(pass(Kind::backward, k));
  return out;
}

double theoretical_bubble(PipelineSchedule s, int64_t ranks, int64_t micros, int64_t chunks) {
  const double p = static_cast<double>(ranks), m = static_cast<double>(micros);
  const double v = s == PipelineSchedule::interleaved ? static_cast<double>(chunks) : 1.0;
  return (p - 1) / (v * m + p - 1);
}

ScheduleRun simulate_schedule(const std::vector<std::vector<PipelinePass>>& passes, int64_t chunks, int64_t micros, double forward,
                              double backward) {
  const auto ranks = static_cast<int64_t>(passes.size());
  const int64_t stages = ranks * chunks;
  // When each stage finished each micro-batch's forward and backward (-1: not yet).
  std::vector<std::vector<double>> fwd(static_cast<size_t>(stages), std::vector<double>(static_cast<size_t>(micros), -1));
  auto bwd = fwd;
  std::vector<size_t> next(static_cast<size_t>(ranks), 0);
  std::vector<double> clock(static_cast<size_t>(ranks), 0), busy(static_cast<size_t>(ranks), 0);
  ScheduleRun run;
  run.peak_held.assign(static_cast<size_t>(ranks), 0);
  std::vector<int64_t> held(static_cast<size_t>(ranks), 0);
  auto at = [](std::vector<std::vector<double>>& t, int64_t s, int64_t m) -> double& {
    return t[static_cast<size_t>(s)][static_cast<size_t>(m)];
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (int64_t r = 0; r < ranks; ++r) {
      const auto& list = passes[static_cast<size_t>(r)];
      auto& i = next[static_cast<size_t>(r)];
      while (i < list.size()) {
        const PipelinePass& p = list[i];
        if (p.micro < 0 || p.micro >= micros || p.chunk < 0 || p.chunk >= chunks) throw Error("pipeline schedule: a pass out of range (internal)");
        const int64_t s = p.chunk * ranks + r;
        double ready = clock[static_cast<size_t>(r)];
        if (p.kind == Kind::forward) {
          if (s > 0 && at(fwd, s - 1, p.micro) < 0) break;
          if (s > 0) ready = std::max(ready, at(fwd, s - 1, p.micro));
        } else {
          if (at(fwd, s, p.micro) < 0 || (s + 1 < stages && at(bwd, s + 1, p.micro) < 0)) break;
          if (s + 1 < stages) ready = std::max(ready, at(bwd, s + 1, p.micro));
        }
        const double cost = p.kind == Kind::forward ? forward : backward;
        clock[static_cast<size_t>(r)] = ready + cost;
        busy[static_cast<size_t>(r)] += cost;
        (p.kind == Kind::forward ? at(fwd, s, p.micro) : at(bwd, s, p.micro)) = ready + cost;
        auto& h = held[static_cast<size_t>(r)];
        h += p.kind == Kind::forward ? 1 : -1;
        run.peak_held[static_cast<size_t>(r)] = std::max(run.peak_held[static_cast<size_t>(r)], h);
        ++i;
        progress = true;
      }
    }
  }
  for (int64_t r = 0; r < ranks; ++r)
    if (next[static_cast<size_t>(r)] < passes[static_cast<size_t>(r)].size())
      throw Error("pipeline schedule: rank " + std::to_string(r) + " waits forever at pass " + std::to_string(next[static_cast<size_t>(r)]) +
                  " (the ranks' orders deadlock)");
  for (int64_t s = 0; s < stages; ++s)
    for (int64_t m = 0; m < micros; ++m)
      if (at(fwd, s, m) < 0 || at(bwd, s, m) < 0)
        throw Error("pipeline schedule: stage " + std::to_string(s) + " never runs micro-batch " + std::to_string(m) + " both ways");
  run.makespan = *std::max_element(clock.begin(), clock.end());
  for (int64_t r = 0; r < ranks; ++r) run.idle.push_back(1.0 - busy[static_cast<size_t>(r)] / run.makespan);
  return run;
}

}  // namespace colossal::parallel
