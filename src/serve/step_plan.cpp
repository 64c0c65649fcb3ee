// Serving steps shared across tensor-parallel ranks: see step_plan.h.
#include "src/serve/step_plan.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "src/dist/group.h"

namespace colossal::serve {
namespace {

enum Kind : int64_t { kIdle = 0, kStep = 1, kStop = 2 };

// [rows, logit rows, tables, ids..., positions..., table_of..., logit rows..., then each table's length
// and entries]
at::Tensor encode(const StepPlan& p) {
  std::vector<int64_t> v{static_cast<int64_t>(p.ids.size()), static_cast<int64_t>(p.logit_rows.size()),
                         static_cast<int64_t>(p.tables.size())};
  v.insert(v.end(), p.ids.begin(), p.ids.end());
  v.insert(v.end(), p.positions.begin(), p.positions.end());
  v.insert(v.end(), p.table_of.begin(), p.table_of.end());
  v.insert(v.end(), p.logit_rows.begin(), p.logit_rows.end());
  for (const auto& t : p.tables) {
    v.push_back(static_cast<int64_t>(t.size()));
    v.insert(v.end(), t.begin(), t.end());
  }
  return at::tensor(v, at::kLong);
}

StepPlan decode(const at::Tensor& t) {
  const int64_t* v = t.const_data_ptr<int64_t>();
  const int64_t n = v[0], m = v[1], tables = v[2];
  size_t at = 3;
  StepPlan p;
  p.ids.assign(v + at, v + at + n), at += static_cast<size_t>(n);
  p.positions.assign(v + at, v + at + n), at += static_cast<size_t>(n);
  p.table_of.assign(v + at, v + at + n), at += static_cast<size_t>(n);
  p.logit_rows.assign(v + at, v + at + m), at += static_cast<size_t>(m);
  for (int64_t t = 0; t < tables; ++t) {
    const auto len = static_cast<size_t>(v[at++]);
    p.tables.emplace_back(v + at, v + at + len);
    at += len;
  }
  return p;
}

}  // namespace

at::Tensor forward_plan(nn::CausalLM& model, const KvBlocks& blocks, const StepPlan& plan) {
  const auto n = static_cast<int64_t>(plan.ids.size());
  nn::PagedRows paged;
  paged.block_size = blocks.block_size();
  paged.positions = plan.positions;
  for (int64_t t : plan.table_of) paged.tables.push_back(plan.tables[static_cast<size_t>(t)].data());
  at::NoGradGuard no_grad;
  auto cache = blocks.cache_for(paged);
  nn::ForwardOptions options;
  options.cache = &cache;
  // ids, positions and the logit rows in one transfer to the device (each .to() of a host tensor waits for a GPU)
  std::vector<int64_t> host = plan.ids;
  host.insert(host.end(), plan.positions.begin(), plan.positions.end());
  host.insert(host.end(), plan.logit_rows.begin(), plan.logit_rows.end());
  const at::Tensor all = at::tensor(host, at::kLong).to(blocks.device());
  options.positions = all.narrow(0, n, n).view({n, 1});
  const at::Tensor features = model.features(all.narrow(0, 0, n).view({n, 1}), options);   // [N, 1, C]
  if (plan.logit_rows.empty()) return {};
  const at::Tensor last = features.index_select(0, all.narrow(0, 2 * n, static_cast<int64_t>(plan.logit_rows.size())));   // [M, 1, C]
  return model.head_logits(last).squeeze(1).to(at::kCPU, at::kFloat);   // [M, V], sampled on the host
}

void StepMirror::send_kind(int64_t kind, const at::Tensor& payload) {
  at::Tensor header = at::tensor({kind, payload.defined() ? payload.numel() : 0}, at::kLong);
  group_.broadcast(header, 0, "serving step header");
  if (payload.defined()) {
    at::Tensor body = payload.contiguous();
    group_.broadcast(body, 0, "serving step");
  }
}

void StepMirror::send(const StepPlan& plan) { send_kind(kStep, encode(plan)); }
void StepMirror::idle() { send_kind(kIdle, {}); }
void StepMirror::stop() { send_kind(kStop, {}); }

std::optional<StepPlan> StepMirror::receive() {
  while (true) {
    at::Tensor header = at::empty({2}, at::kLong);
    group_.broadcast(header, 0, "serving step header");
    const int64_t kind = header[0].item<int64_t>();
    if (kind == kStop) return std::nullopt;
    if (kind == kIdle) continue;
    at::Tensor body = at::empty({header[1].item<int64_t>()}, at::kLong);
    group_.broadcast(body, 0, "serving step");
    return decode(body);
  }
}

void follow_steps(nn::CausalLM& model, KvBlocks& blocks, StepMirror& mirror) {
  model.eval();
  while (auto plan = mirror.receive()) forward_plan(model, blocks, *plan);
}

}  // namespace colossal::serve
