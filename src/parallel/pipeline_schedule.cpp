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

// Zero-bubble by list scheduling: time runs in whole passes (F = B = W = 1); at each tick every idle rank
// takes a ready B (its forward done, the stage after's B done), else a forward (the stage before's done)
// while fewer than P - r of its micro-batches wait for their B (1F1B's bound) and fewer than P + 1 for
// their W, else a W of a micro-batch whose B is done. The W bound is the least at which this reaches
// the zero-bubble bound (P - 1) / (3 M + P - 1) when M >= P (at P, a micro-batch more than 1F1B's first
// stage holds, the deferred Ws cannot all fill the drain); found by running the rule at P = 2 .. 8.
std::vector<std::vector<PipelinePass>> zero_bubble_passes(int64_t ranks, int64_t micros) {
  const auto P = static_cast<size_t>(ranks), M = static_cast<size_t>(micros);
  constexpr int64_t kNot = -1;
  // When each rank finished each micro-batch's F and B (tick of completion), kNot before.
  std::vector<std::vector<int64_t>> f(P, std::vector<int64_t>(M, kNot)), b = f;
  std::vector<size_t> next_f(P, 0), next_b(P, 0), next_w(P, 0);
  std::vector<int64_t> busy_until(P, 0);
  std::vector<std::vector<PipelinePass>> out(P);
  const size_t total = 3 * P * M;
  size_t done = 0;
  for (int64_t tick = 0; done < total; ++tick) {
    if (tick > static_cast<int64_t>(4 * total + 16)) throw Error("zero-bubble schedule: no progress (internal)");
    for (size_t r = 0; r < P; ++r) {
      if (busy_until[r] > tick) continue;
      const size_t before_b = next_f[r] - next_b[r], before_w = next_f[r] - next_w[r];
      auto finished = [&](int64_t t) { return t != kNot && t <= tick; };
      const bool b_ready = next_b[r] < next_f[r] && (r + 1 == P || finished(b[r + 1][next_b[r]]));
      const bool f_ready = next_f[r] < M && (r == 0 || finished(f[r - 1][next_f[r]])) && before_b < P - r && before_w < P + 1;
      const bool w_ready = next_w[r] < next_b[r];
      if (b_ready) {
        b[r][next_b[r]] = tick + 1;
        out[r].push_back({PipelinePass::backward, static_cast<int64_t>(next_b[r]++), 0});
      } else if (f_ready) {
        f[r][next_f[r]] = tick + 1;
        out[r].push_back({PipelinePass::forward, static_cast<int64_t>(next_f[r]++), 0});
      } else if (w_ready) {
        out[r].push_back({PipelinePass::weight, static_cast<int64_t>(next_w[r]++), 0});
      } else {
        continue;
      }
      busy_until[r] = tick + 1;
      ++done;
    }
  }
  return out;
}

}  // namespace

std::vector<PipelinePass> pipeline_passes(PipelineSchedule s, int64_t ranks, int64_t rank, int64_t micros, int64_t chunks) {
  if (ranks < 1 || rank < 0 || rank >= ranks || micros < 1 || chunks < 1)
    throw Error("pipeline schedule: rank " + std::to_string(rank) + " of " + std::to_string(ranks) + ", " + std::to_string(micros) +
                " micro-batches, " + std::to_string(chunks) + " chunks (internal)");
  std::vector<PipelinePass> out;
  if (s == PipelineSchedule::zero_bubble) return zero_bubble_passes(ranks, micros)[static_cast<size_t>(rank)];
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

double pass_cost(PipelineSchedule s, PipelinePass::Kind kind) {
  if (kind == Kind::forward || kind == Kind::weight) return 1;
  return s == PipelineSchedule::zero_bubble ? 1 : 2;
}

double theoretical_bubble(PipelineSchedule s, int64_t ranks, int64_t micros, int64_t chunks) {
  const double p = static_cast<double>(ranks), m = static_cast<double>(micros);
  if (s == PipelineSchedule::zero_bubble) return (p - 1) / (3 * m + p - 1);
  const double v = s == PipelineSchedule::interleaved ? static_cast<double>(chunks) : 1.0;
  return (p - 1) / (v * m + p - 1);
}

ScheduleRun simulate_schedule(const std::vector<std::vector<PipelinePass>>& passes, int64_t chunks, int64_t micros, double forward,
                              double backward, double weight) {
  const auto ranks = static_cast<int64_t>(passes.size());
  const int64_t stages = ranks * chunks;
  // When each stage finished each micro-batch's forward and backward (-1: not yet).
  std::vector<std::vector<double>> fwd(static_cast<size_t>(stages), std::vector<double>(static_cast<size_t>(micros), -1));
  auto bwd = fwd, wgt = fwd;
  bool split = false;   // some pass is a W: a micro-batch is held until it
  for (const auto& list : passes)
    for (const auto& p : list) split = split || p.kind == Kind::weight;
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
        } else if (p.kind == Kind::weight) {
          if (at(bwd, s, p.micro) < 0) break;
        } else {
          if (at(fwd, s, p.micro) < 0 || (s + 1 < stages && at(bwd, s + 1, p.micro) < 0)) break;
          if (s + 1 < stages) ready = std::max(ready, at(bwd, s + 1, p.micro));
        }
        const double cost = p.kind == Kind::forward ? forward : p.kind == Kind::weight ? weight : backward;
        clock[static_cast<size_t>(r)] = ready + cost;
        busy[static_cast<size_t>(r)] += cost;
        (p.kind == Kind::forward ? at(fwd, s, p.micro) : p.kind == Kind::weight ? at(wgt, s, p.micro) : at(bwd, s, p.micro)) = ready + cost;
        auto& h = held[static_cast<size_t>(r)];
        if (p.kind == Kind::forward) ++h;
        if (p.kind == (split ? Kind::weight : Kind::backward)) --h;
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
      if (at(fwd, s, m) < 0 || at(bwd, s, m) < 0 || (split && at(wgt, s, m) < 0))
        throw Error("pipeline schedule: stage " + std::to_string(s) + " never runs micro-batch " + std::to_string(m) + " both ways");
  run.makespan = *std::max_element(clock.begin(), clock.end());
  for (int64_t r = 0; r < ranks; ++r) run.idle.push_back(1.0 - busy[static_cast<size_t>(r)] / run.makespan);
  return run;
}

}  // namespace colossal::parallel
