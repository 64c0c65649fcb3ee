// Group: see group.h.
#include "src/dist/group.h"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>
#include <utility>
#include <vector>

#include "src/core/error.h"
#include "src/core/text.h"
#include "src/dist/backend.h"
#include "src/dist/roster.h"

namespace colossal::dist {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

c10d::ReduceOp to_c10d(Reduce op) {
  switch (op) {
    case Reduce::max: return c10d::ReduceOp::MAX;
    case Reduce::min: return c10d::ReduceOp::MIN;
    default: return c10d::ReduceOp::SUM;
  }
}

bool is_timeout(const std::string& message) {
  return message.find("imed out") != std::string::npos || message.find("imeout") != std::string::npos;
}

// The backend's message without its source location and decorations, on one line.
std::string first_line(std::string m) {
  if (m.size() > 0 && m[0] == '[') {
    size_t close = m.find("] ");
    if (close != std::string::npos && close < 200) m = m.substr(close + 2);
  }
  const size_t nl = m.find('\n');
  if (nl != std::string::npos) m = m.substr(0, nl);
  const size_t hint = m.find(" This is typically");
  if (hint != std::string::npos) m = m.substr(0, hint);
  return m;
}

}  // namespace

CommCounters& CommCounters::operator+=(const CommCounters& o) {
  calls += o.calls;
  bytes += o.bytes;
  busy_s += o.busy_s;
  wait_s += o.wait_s;
  return *this;
}

struct Pending::State {
  std::vector<c10::intrusive_ptr<c10d::Work>> works;   // one collective, or a shard exchange's sends and receives
  std::function<void()> finish;                         // after every work completed (a reduce-scatter's sum)
  std::string op, what;
  std::string channel;       // the roster's count it entered: the group's, or a point-to-point pair's
  std::vector<int64_t> peers;   // the world ranks it waits on (a pair's other rank), or empty: the group's
  int64_t seq = 0, bytes = 0;
  Clock::time_point launched;
  std::atomic<int64_t> done_ns{0};   // steady-clock time the backend finished, 0 = not yet known
};

Group::Group(std::string name) : name_(std::move(name)), ranks_{0} {}

Group::Group(std::string name, std::vector<int64_t> ranks, int64_t index, std::unique_ptr<BackendHandle> backend,
             std::shared_ptr<Roster> roster, c10::Device comm_device)
    : name_(std::move(name)), ranks_(std::move(ranks)), index_(index), backend_(std::move(backend)),
      roster_(std::move(roster)), comm_device_(comm_device),
      // Gloo's shard collectives copy the whole through a flat buffer its worker thread allocates on
      // every call (and glibc's per-thread heaps keep); its point-to-point operations read and write
      // the caller's memory directly, so on Gloo the shards are exchanged with sends and receives.
      point_to_point_(backend_ && backend_->pg->getBackendName() == "gloo") {
  if (ranks_.size() != static_cast<size_t>(backend_->pg->getSize()))
    throw Error("group " + name_ + ": backend has " + std::to_string(backend_->pg->getSize()) + " ranks, expected " +
                std::to_string(ranks_.size()));
}

Group::~Group() = default;

Pending Group::launch(const std::string& op, const std::string& what, const at::Tensor& t, const Start& start,
                      const std::string& channel) {
  Pending p;
  p.state_ = std::make_shared<Pending::State>();
  auto& s = *p.state_;
  s.op = op;
  s.what = what;
  s.bytes = static_cast<int64_t>(t.nbytes());
  s.channel = channel.empty() ? name_ : channel;
  s.seq = roster_ ? roster_->enter(s.channel) : 0;
  s.launched = Clock::now();
  {
    std::lock_guard<std::mutex> lock(counters_mu_);
    ++counters_.calls;
    counters_.bytes += s.bytes;
  }
  std::vector<at::Tensor> v{t};
  try {
    start(p, v);
  } catch (const std::exception& e) {
    fail(p, e.what());
  }
  // Completion time from the backend's future, so busy time is the collective's own duration even
  // when the caller waits for it much later (the overlap figure depends on it). Point-to-point
  // exchanges have no future: their busy time is launch to wait.
  if (s.works.size() != 1 || !channel.empty()) return p;   // point-to-point works have no future (asking throws)
  try {
    std::weak_ptr<Pending::State> weak = p.state_;
    s.works[0]->getFuture()->addCallback([weak](c10::ivalue::Future&) {
      if (auto state = weak.lock()) state->done_ns = Clock::now().time_since_epoch().count();
    });
  } catch (const std::exception&) {
    // A backend without futures: busy time falls back to launch-to-wait.
  }
  return p;
}

[[noreturn]] void Group::fail(const Pending& p, const std::string& cause) {
  const auto& s = *p.state_;
  const std::string me = roster_ ? roster_->who(ranks_[static_cast<size_t>(index_)]) : "rank 0";
  const std::string op = s.op + " on group " + name_ + (s.what.empty() ? "" : " (" + s.what + ")");
  std::string detail;
  auto behind = roster_ ? roster_->laggards(s.channel, s.peers.empty() ? ranks_ : s.peers, s.seq, &detail) : std::vector<int64_t>{};
  const double waited = since(s.launched);
  if (is_timeout(cause)) {
    const std::string after = format_number(std::round(waited)) + " s";
    if (!behind.empty())
      throw Error(detail + " stopped responding during " + op + " after " + after + " (seen from " + me + "); ending the job");
    throw Error(me + ": " + op + " timed out after " + after + " (no rank is known to lag: " + first_line(cause) +
                "); ending the job");
  }
  throw Error(me + ": " + op + " failed: " + first_line(cause) +
              (behind.empty() ? "" : " (" + detail + " had not reached it: that rank probably ended first)") +
              "; ending the job");
}

void Group::wait(Pending& p) {
  if (!p.state_) return;
  auto& s = *p.state_;
  const auto t0 = Clock::now();
  try {
    for (auto& w : s.works) w->wait();
    if (s.finish) s.finish();
  } catch (const std::exception& e) {
    fail(p, e.what());
  }
  std::lock_guard<std::mutex> lock(counters_mu_);
  counters_.wait_s += since(t0);
  const int64_t done = s.done_ns.load();
  counters_.busy_s += done > 0 ? std::chrono::duration<double>(Clock::duration(done) - s.launched.time_since_epoch()).count()
                                  : since(s.launched);
  p.state_.reset();
}

bool Group::test(Pending& p) {
  if (!p.state_) return true;
  for (auto& w : p.state_->works)
    if (!w->isCompleted()) return false;
  wait(p);   // completed: reports a failure, counts the time
  return true;
}

Pending Group::all_reduce_async(const at::Tensor& t, const std::string& what) {
  if (!backend_) return {};
  return launch("all_reduce", what, t, [&](Pending& p, std::vector<at::Tensor>& v) {
    p.state_->works = {backend_->pg->allreduce(v, c10d::AllreduceOptions{})};
  });
}

bool Group::in_place(const at::Tensor& whole, const at::Tensor& shard) const {
  return shard.data_ptr() == static_cast<const char*>(whole.data_ptr()) + index_ * shard.nbytes() && shard.nbytes() > 0;
}

void Group::check_shards(const char* op, const at::Tensor& whole, const at::Tensor& shard, const std::string& what) const {
  const bool fits = whole.numel() == shard.numel() * size() && whole.scalar_type() == shard.scalar_type() &&
                    whole.device() == shard.device() && whole.is_contiguous() && shard.is_contiguous();
  const auto* w = static_cast<const char*>(whole.data_ptr());
  const auto* h = static_cast<const char*>(shard.data_ptr());
  const bool overlaps = h < w + whole.nbytes() && w < h + shard.nbytes();
  const bool allowed = !overlaps || (std::string(op) == "all_gather" && in_place(whole, shard));
  if (!fits || !allowed)
    throw Error(std::string(op) + " on group " + name_ + " (" + what + "): " + std::to_string(whole.numel()) + " " +
                c10::toString(whole.scalar_type()) + " values on " + whole.device().str() + " for " + std::to_string(size()) +
                " shards of " + std::to_string(shard.numel()) + " " + c10::toString(shard.scalar_type()) + " on " +
                shard.device().str() + " (internal: both contiguous, whole = ranks x shard, one dtype and device, the shard " +
                "apart from the whole or, for all_gather, this rank's part of it)");
}

Pending Group::shard_collective(bool gather, const at::Tensor& whole, const at::Tensor& shard, const std::string& what) {
  const char* op = gather ? "all_gather" : "reduce_scatter";
  check_shards(op, whole, shard, what);
  const at::Tensor& in = gather ? shard : whole;   // what is sent (and counted)
  const at::Tensor& out = gather ? whole : shard;
  if (!backend_) {   // one rank: the whole is its shard
    if (!in_place(whole, shard)) out.copy_(in.view(out.sizes()));
    return {};
  }
  if (point_to_point_) return exchange(gather, whole.view({-1}), shard.view({-1}), op, what);
  return launch(op, what, in, [&](Pending& p, std::vector<at::Tensor>&) {
    at::Tensor o = out.view({-1}), i = in.view({-1});
    if (gather && in_place(whole, shard)) i = i.clone();   // the backend's in-place contract is its own
    p.state_->works = {gather ? backend_->pg->_allgather_base(o, i, c10d::AllgatherOptions{})
                              : backend_->pg->_reduce_scatter_base(o, i, c10d::ReduceScatterOptions{})};
  });
}

Pending Group::exchange(bool gather, const at::Tensor& whole, const at::Tensor& shard, const char* op, const std::string& what,
                        int64_t root) {
  const int64_t n = shard.numel(), me = index_;
  auto part = [&](int64_t j) { return whole.narrow(0, j * n, n); };
  // Every rank issues the group's collectives in the same order, so the same count names the same
  // exchange on every rank; matching is by (peer, tag), so exchanges in flight together never mix.
  const int tag = static_cast<int>(exchanges_++ % (int64_t{1} << 30));
  return launch(op, what, gather ? shard : whole, [&](Pending& p, std::vector<at::Tensor>&) {
    auto& works = p.state_->works;
    auto send = [&](const at::Tensor& t, int64_t j) {
      std::vector<at::Tensor> v{t};
      works.push_back(backend_->pg->send(v, static_cast<int>(j), tag));
    };
    auto recv = [&](const at::Tensor& t, int64_t j) {
      std::vector<at::Tensor> v{t};
      works.push_back(backend_->pg->recv(v, static_cast<int>(j), tag));
    };
    if (gather) {   // each peer's shard straight into its part of the whole (on `root` only, when given)
      const bool receives = root < 0 || root == me;
      if (receives && !in_place(whole, shard)) part(me).copy_(shard);
      for (int64_t j = 0; j < size(); ++j) {
        if (j == me) continue;
        if (root < 0 || j == root) send(shard, j);
        if (receives) recv(part(j), j);
      }
      return;
    }
    // Reduce-scatter: each peer's part j goes to rank j; the peers' parts of this rank's shard arrive
    // in spare buffers and are summed, in rank order, when the caller waits.
    std::vector<at::Tensor> parts(static_cast<size_t>(size()));
    for (int64_t j = 0; j < size(); ++j) {
      if (j == me) {
        parts[static_cast<size_t>(j)] = part(me);
        continue;
      }
      send(part(j), j);
      parts[static_cast<size_t>(j)] = scratch_.take(n, shard.options());
      recv(parts[static_cast<size_t>(j)], j);
    }
    p.state_->finish = [this, parts, out = at::Tensor(shard), me]() mutable {
      if (parts.size() == 1) out.copy_(parts[0]);
      else at::add_out(out, parts[0], parts[1]);
      for (size_t j = 2; j < parts.size(); ++j) out.add_(parts[j]);
      for (size_t j = 0; j < parts.size(); ++j)
        if (static_cast<int64_t>(j) != me) scratch_.give(parts[j]);
    };
  });
}

void Group::gather(const at::Tensor& whole, const at::Tensor& shard, int64_t root, const std::string& what) {
  const bool mine = root == index_;
  if (mine) check_shards("gather", whole, shard, what);
  if (!backend_) {
    whole.view({-1}).copy_(shard.view({-1}));
    return;
  }
  Pending p = point_to_point_ ? exchange(true, mine ? whole.view({-1}) : at::Tensor(), shard.view({-1}), "gather", what, root)
                              // elsewhere an all-gather, whose copy the other ranks drop
                              : all_gather_async(mine ? whole : at::empty({shard.numel() * size()}, shard.options()), shard, what);
  wait(p);
}

Pending Group::all_gather_async(const at::Tensor& whole, const at::Tensor& shard, const std::string& what) {
  return shard_collective(true, whole, shard, what);
}

Pending Group::reduce_scatter_async(const at::Tensor& shard, const at::Tensor& whole, const std::string& what) {
  return shard_collective(false, whole, shard, what);
}

Pending Group::ring_shift_async(const at::Tensor& out, const at::Tensor& in, const std::string& what) {
  if (out.numel() != in.numel() || out.scalar_type() != in.scalar_type() || !out.is_contiguous() || !in.is_contiguous())
    throw Error("ring_shift on group " + name_ + " (" + what + "): send and receive buffers differ in size or type, or are not contiguous");
  if (!backend_) {
    in.copy_(out);
    return {};
  }
  const int tag = static_cast<int>(exchanges_++ % (int64_t{1} << 30));   // the same count on every rank
  const int next = static_cast<int>((index_ + 1) % size()), prev = static_cast<int>((index_ + size() - 1) % size());
  return launch("ring_shift", what, out, [&](Pending& p, std::vector<at::Tensor>&) {
    std::vector<at::Tensor> send{out.view({-1})}, recv{in.view({-1})};
    p.state_->works.push_back(backend_->pg->send(send, next, tag));
    p.state_->works.push_back(backend_->pg->recv(recv, prev, tag));
  });
}

Pending Group::send_async(const at::Tensor& t, int64_t peer, const std::string& what) { return point_to_point(true, t, peer, what); }
Pending Group::recv_async(const at::Tensor& t, int64_t peer, const std::string& what) { return point_to_point(false, t, peer, what); }

Pending Group::point_to_point(bool send, const at::Tensor& t, int64_t peer, const std::string& what) {
  const char* op = send ? "send" : "recv";
  if (!backend_ || peer < 0 || peer >= size() || peer == index_ || !t.is_contiguous())
    throw Error(std::string(op) + " on group " + name_ + " (" + what + "): peer " + std::to_string(peer) + " of " + std::to_string(size()) +
                " ranks from rank " + std::to_string(index_) + (t.is_contiguous() ? "" : ", a non-contiguous tensor") +
                " (internal: another rank of an active group, contiguous memory)");
  if (sent_.empty()) sent_.assign(static_cast<size_t>(size()), 0), received_.assign(static_cast<size_t>(size()), 0);
  // Tags above the shard exchanges' (< 2^30): the k-th transfer each way between a pair has tag k.
  int64_t& count = (send ? sent_ : received_)[static_cast<size_t>(peer)];
  const int tag = static_cast<int>((int64_t{1} << 30) + count++ % (int64_t{1} << 30));
  const int64_t lo = std::min(index_, peer), hi = std::max(index_, peer);
  const std::string pair = name_ + " pair " + std::to_string(lo) + "-" + std::to_string(hi);
  Pending p = launch(op, what, t, [&](Pending& pending, std::vector<at::Tensor>& v) {
    pending.state_->works.push_back(send ? backend_->pg->send(v, static_cast<int>(peer), tag) : backend_->pg->recv(v, static_cast<int>(peer), tag));
  }, pair);
  p.state_->peers = {ranks_[static_cast<size_t>(lo)], ranks_[static_cast<size_t>(hi)]};
  return p;
}

void Group::all_to_all(const at::Tensor& out, const at::Tensor& in, const std::string& what) {
  if (out.numel() != in.numel() || out.scalar_type() != in.scalar_type() || !out.is_contiguous() || !in.is_contiguous() ||
      in.numel() % size() != 0)
    throw Error("all_to_all on group " + name_ + " (" + what + "): buffers differ, are not contiguous, or do not split into " +
                std::to_string(size()) + " equal parts");
  if (!backend_) {
    out.copy_(in);
    return;
  }
  const int64_t n = in.numel() / size();
  const at::Tensor o = out.view({-1}), i = in.view({-1});
  Pending p;
  if (point_to_point_) {   // Gloo: each peer's part by send and receive, matched by (peer, tag)
    const int tag = static_cast<int>(exchanges_++ % (int64_t{1} << 30));
    p = launch("all_to_all", what, in, [&](Pending& pending, std::vector<at::Tensor>&) {
      o.narrow(0, index_ * n, n).copy_(i.narrow(0, index_ * n, n));
      for (int64_t j = 0; j < size(); ++j) {
        if (j == index_) continue;
        std::vector<at::Tensor> send{i.narrow(0, j * n, n)}, recv{o.narrow(0, j * n, n)};
        pending.state_->works.push_back(backend_->pg->send(send, static_cast<int>(j), tag));
        pending.state_->works.push_back(backend_->pg->recv(recv, static_cast<int>(j), tag));
      }
    });
  } else {
    p = launch("all_to_all", what, in, [&](Pending& pending, std::vector<at::Tensor>&) {
      std::vector<int64_t> equal;   // empty split sizes: equal parts
      pending.state_->works = {backend_->pg->alltoall_base(const_cast<at::Tensor&>(o), const_cast<at::Tensor&>(i), equal, equal,
                                                           c10d::AllToAllOptions{})};
    });
  }
  wait(p);
}

void Group::all_gather(const at::Tensor& whole, const at::Tensor& shard, const std::string& what) {
  Pending p = all_gather_async(whole, shard, what);
  wait(p);
}

void Group::reduce_scatter(const at::Tensor& shard, const at::Tensor& whole, const std::string& what) {
  Pending p = reduce_scatter_async(shard, whole, what);
  wait(p);
}

void Group::blocking(const std::string& op, const std::string& what, at::Tensor& t, const Start& start) {
  if (!backend_) return;
  if (t.device() != comm_device_) {   // e.g. a host scalar on an NCCL group: a device copy takes part
    at::Tensor staged = t.to(comm_device_);
    blocking(op, what, staged, start);
    t.copy_(staged);
    return;
  }
  Pending p = launch(op, what, t, start);
  wait(p);
}

void Group::all_reduce(at::Tensor& t, Reduce op, const std::string& what) {
  c10d::AllreduceOptions o;
  o.reduceOp = to_c10d(op);
  blocking("all_reduce", what, t, [&](Pending& p, std::vector<at::Tensor>& v) { p.state_->works = {backend_->pg->allreduce(v, o)}; });
}

void Group::broadcast(at::Tensor& t, int64_t root_index, const std::string& what) {
  c10d::BroadcastOptions o;
  o.rootRank = root_index;
  blocking("broadcast", what, t, [&](Pending& p, std::vector<at::Tensor>& v) { p.state_->works = {backend_->pg->broadcast(v, o)}; });
}

void Group::reduce(at::Tensor& t, int64_t root_index, const std::string& what) {
  c10d::ReduceOptions o;
  o.rootRank = root_index;
  o.reduceOp = c10d::ReduceOp::SUM;
  blocking("reduce", what, t, [&](Pending& p, std::vector<at::Tensor>& v) { p.state_->works = {backend_->pg->reduce(v, o)}; });
}

void Group::barrier(const std::string& what) {
  if (!backend_) return;
  // An all-reduce of one value rather than c10d's barrier: it honours the same timeout and reaches the
  // same error path on every backend.
  at::Tensor t = at::zeros({1}, at::TensorOptions(at::kFloat).device(comm_device_));
  all_reduce(t, Reduce::sum, what);
}

CommCounters Group::take_counters() {
  std::lock_guard<std::mutex> lock(counters_mu_);
  return std::exchange(counters_, CommCounters{});
}

}  // namespace colossal::dist
