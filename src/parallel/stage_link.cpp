// Stage link: see stage_link.h.
#include "src/parallel/stage_link.h"

#include <ATen/ATen.h>
#include <chrono>

#include "src/core/error.h"

namespace colossal::parallel {
namespace {

constexpr int64_t kMaxDims = 8;   // a shape message: [clock, dtype, dims, d0 .. d7]

double since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

StageLink::StageLink(dist::Group& pipeline, int64_t chunks) : group_(pipeline), chunks_(chunks) {}

void StageLink::send(const at::Tensor& t, int64_t peer, const std::string& what) {
  // Sent tensors are kept until their transfer completes; the ones done by now are let go.
  size_t done = 0;
  while (done < sending_.size() && group_.test(sending_[done].first)) ++done;
  sending_.erase(sending_.begin(), sending_.begin() + static_cast<std::ptrdiff_t>(done));
  sending_.emplace_back(group_.send_async(t, peer, what), t);
}

void StageLink::recv(const at::Tensor& t, int64_t peer, const std::string& what) {
  const auto t0 = std::chrono::steady_clock::now();
  dist::Pending p = group_.recv_async(t, peer, what);
  group_.wait(p);
  wait_s_ += since(t0);
}

at::Tensor StageLink::lend(const std::vector<int64_t>& shape, const at::TensorOptions& options) {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  at::Tensor flat = spares_.take(numel, options);
  lent_.push_back(flat);
  return flat.view(shape);
}

void StageLink::send_activation(const at::Tensor& x, int64_t stage, const std::string& key, double clock, const std::string& what) {
  const at::Tensor data = x.detach().contiguous();
  const int64_t peer = rank_of(stage + 1);
  const bool agreed = agreed_.count({stage, key}) > 0;
  if (!agreed) {
    if (data.dim() > kMaxDims) throw Error("pipeline: an activation of " + std::to_string(data.dim()) + " dimensions (internal: at most 8)");
    agreed_[{stage, key}] = {data.sizes().vec(), data.scalar_type()};
  }
  at::Tensor meta = at::zeros({agreed ? 1 : 3 + kMaxDims}, at::TensorOptions(at::kDouble).device(data.device()));
  if (!agreed) {
    std::vector<double> v{clock, static_cast<double>(static_cast<int>(data.scalar_type())), static_cast<double>(data.dim())};
    for (int64_t d : data.sizes()) v.push_back(static_cast<double>(d));
    v.resize(3 + kMaxDims, 0);
    meta.copy_(at::tensor(v, at::kDouble));
  } else {
    meta.fill_(clock);
  }
  send(meta, peer, what + " (its clock and shape)");
  send(data, peer, what);
}

at::Tensor StageLink::recv_activation(int64_t stage, const std::string& key, const at::TensorOptions& device, double* clock,
                                      const std::string& what) {
  const int64_t peer = rank_of(stage - 1);
  auto it = agreed_.find({stage - 1, key});
  const bool agreed = it != agreed_.end();
  at::Tensor meta = lend({agreed ? 1 : 3 + kMaxDims}, device.dtype(at::kDouble));
  recv(meta, peer, what + " (its clock and shape)");
  const at::Tensor m = meta.cpu();
  const double* v = m.const_data_ptr<double>();
  *clock = v[0];
  if (!agreed) {
    std::vector<int64_t> shape;
    for (int64_t d = 0; d < static_cast<int64_t>(v[2]); ++d) shape.push_back(static_cast<int64_t>(v[3 + d]));
    it = agreed_.emplace(std::make_pair(stage - 1, key), std::make_pair(shape, static_cast<at::ScalarType>(static_cast<int>(v[1])))).first;
  }
  at::Tensor x = lend(it->second.first, device.dtype(it->second.second));
  recv(x, peer, what);
  return x;
}

void StageLink::send_grad(const at::Tensor& g, int64_t stage, double clock, const std::string& what) {
  const int64_t peer = rank_of(stage - 1);
  send(at::full({1}, clock, at::TensorOptions(at::kDouble).device(g.device())), peer, what + " (its clock)");
  send(g.contiguous(), peer, what);
}

at::Tensor StageLink::recv_grad(const at::Tensor& like, int64_t stage, double* clock, const std::string& what) {
  const int64_t peer = rank_of(stage + 1);
  at::Tensor meta = lend({1}, like.options().dtype(at::kDouble));
  recv(meta, peer, what + " (its clock)");
  *clock = meta.item<double>();
  at::Tensor g = lend(like.sizes().vec(), like.options());
  recv(g, peer, what);
  return g;
}

void StageLink::finish_sends() {
  for (auto& [pending, tensor] : sending_) group_.wait(pending);
  sending_.clear();
  // A buffer whose memory nothing else holds (its storage's only owner is the flat tensor kept here) is
  // free for the next step's receives; the rest are checked again at the next step's end.
  std::vector<at::Tensor> still;
  for (auto& t : lent_) {
    if (t.storage().use_count() == 1) spares_.give(std::move(t));
    else still.push_back(std::move(t));
  }
  lent_ = std::move(still);
}

double StageLink::take_wait_s() { return std::exchange(wait_s_, 0.0); }

}  // namespace colossal::parallel
