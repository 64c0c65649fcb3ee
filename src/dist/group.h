// Group: the one door every collective goes through (ARCHITECTURE.md: "all communication goes through
// dist's group wrapper"). It owns a c10d backend (Gloo on CPU, NCCL for CUDA tensors) and adds what
// c10d leaves to the caller:
//  - errors that name this rank, the operation, the group and the rank(s) that never arrived (from the
//    roster's progress counters), as one line, when the backend's timeout (set by the runtime) fires;
//  - per-step counters (calls, bytes, time busy, time the caller waited) for metrics.jsonl;
//  - a group without a backend (one process, or a mesh dimension of size 1) that does nothing, so
//    callers never branch on "is this distributed".
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "src/core/spare_buffers.h"

namespace colossal::dist {

class Roster;
struct BackendHandle;   // the c10d backend (group.cpp)

struct CommCounters {
  int64_t calls = 0;
  int64_t bytes = 0;       // payload handed to collectives (not wire bytes)
  double busy_s = 0;       // launch-to-completion time summed over collectives
  double wait_s = 0;       // time callers spent blocked waiting for them
  CommCounters& operator+=(const CommCounters& o);
};

enum class Reduce { sum, max, min };

// An asynchronous collective in flight; Group::wait finishes it (and reports its failure).
class Pending {
 public:
  bool active() const { return state_ != nullptr; }   // launched and not yet waited for

 private:
  friend class Group;
  struct State;
  std::shared_ptr<State> state_;
};

class Group {
 public:
  // A group of one without a backend: collectives return at once and count nothing.
  explicit Group(std::string name);
  // `ranks` are world ranks in group order; this process is ranks[index]. Tensors of blocking
  // collectives that live elsewhere are staged through `comm_device` (NCCL reduces GPU memory only).
  Group(std::string name, std::vector<int64_t> ranks, int64_t index, std::unique_ptr<BackendHandle> backend,
        std::shared_ptr<Roster> roster, c10::Device comm_device = c10::kCPU);
  ~Group();
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  const std::string& name() const { return name_; }
  int64_t size() const { return static_cast<int64_t>(ranks_.size()); }
  int64_t rank() const { return index_; }               // within the group
  bool active() const { return backend_ != nullptr; }   // false: every collective is a no-op

  // Blocking collectives. `what` names the purpose in errors ("gradient bucket 3").
  void all_reduce(at::Tensor& t, Reduce op = Reduce::sum, const std::string& what = "");
  void broadcast(at::Tensor& t, int64_t root_index, const std::string& what = "");
  // The sum over the group onto group rank `root_index` only (elsewhere `t` is left undefined in value).
  void reduce(at::Tensor& t, int64_t root_index, const std::string& what = "");
  void barrier(const std::string& what);

  // Asynchronous all-reduce of a contiguous tensor, in place.
  Pending all_reduce_async(const at::Tensor& t, const std::string& what);

  // The shards ZeRO moves (contiguous tensors on the communication device; `whole` holds size()
  // shards in group-rank order, each shard.numel() long):
  //   all-gather     every rank's `shard` into `whole` on every rank;
  //   reduce-scatter the sum over ranks of `whole`, of which this rank keeps its own shard in `shard`.
  // A group without a backend copies one into the other. `shard` must not overlap `whole`, except that
  // an all-gather may be in place: `shard` this rank's part of `whole`.
  void all_gather(const at::Tensor& whole, const at::Tensor& shard, const std::string& what);
  void reduce_scatter(const at::Tensor& shard, const at::Tensor& whole, const std::string& what);
  Pending all_gather_async(const at::Tensor& whole, const at::Tensor& shard, const std::string& what);
  Pending reduce_scatter_async(const at::Tensor& shard, const at::Tensor& whole, const std::string& what);
  // Every rank's `shard` into `whole` on group rank `root` only (elsewhere `whole` is not touched and
  // may be undefined): what a checkpoint's writer of a chunk's tensors needs, without a copy per rank.
  void gather(const at::Tensor& whole, const at::Tensor& shard, int64_t root, const std::string& what);
  void wait(Pending& p);
  // True once `p` has completed (then finished as wait() finishes it); false while it runs.
  bool test(Pending& p);

  // Sequence parallelism's exchanges (contiguous tensors on the communication device):
  //   ring_shift  sends `out` to group rank (rank + 1) % size and receives `in` from (rank - 1) % size
  //               (ring attention passes keys and values around the ring this way);
  //   all_to_all  part j of `in` (size() equal parts, flat) goes to group rank j, and part j of `out`
  //               comes from rank j (DeepSpeed-Ulysses's head/sequence exchange).
  // A group without a backend copies `out` into `in`, `in` into `out`.
  Pending ring_shift_async(const at::Tensor& out, const at::Tensor& in, const std::string& what);
  void all_to_all(const at::Tensor& out, const at::Tensor& in, const std::string& what);

  // Pipeline parallelism's point-to-point transfers (contiguous tensors on the communication device):
  // `t` to group rank `peer`, or from it into `t`. The k-th send from one rank to another matches the
  // k-th receive the other posts from it, so a pair must issue its transfers in the same order on both
  // sides; any number may be in flight. Each pair keeps its own progress count in the roster, so a
  // transfer that times out names the peer that stopped or ended. A group without a backend refuses
  // them (a rank cannot send to itself).
  Pending send_async(const at::Tensor& t, int64_t peer, const std::string& what);
  Pending recv_async(const at::Tensor& t, int64_t peer, const std::string& what);

  // Frees the receive buffers kept for the next reduce-scatters (before a phase that runs none).
  void free_spares() { scratch_.clear(); }

  // Counters since the last take (then reset).
  CommCounters take_counters();

 private:
  // Counts the collective, hands `start` the tensor list to give the backend, and records when the
  // backend finishes it. `t` must live on the communication device.
  using Start = std::function<void(Pending&, std::vector<at::Tensor>&)>;
  // `channel`: the roster's progress count this collective enters ("" = the group's own).
  Pending launch(const std::string& op, const std::string& what, const at::Tensor& t, const Start& start,
                 const std::string& channel = "");
  Pending point_to_point(bool send, const at::Tensor& t, int64_t peer, const std::string& what);
  // launch + wait, staging `t` through the communication device when it lives elsewhere.
  void blocking(const std::string& op, const std::string& what, at::Tensor& t, const Start& start);
  [[noreturn]] void fail(const Pending& p, const std::string& cause);
  // All-gather (`gather`) or reduce-scatter between `whole` and this rank's `shard`.
  Pending shard_collective(bool gather, const at::Tensor& whole, const at::Tensor& shard, const std::string& what);
  // On Gloo: the shards exchanged by point-to-point sends and receives on the caller's memory. A gather
  // with `root` >= 0 fills `whole` on that rank only (elsewhere it is undefined).
  Pending exchange(bool gather, const at::Tensor& whole, const at::Tensor& shard, const char* op, const std::string& what,
                   int64_t root = -1);
  bool in_place(const at::Tensor& whole, const at::Tensor& shard) const;   // shard is this rank's part of whole
  // Error unless `whole` is size() shards of `shard`'s dtype and device.
  void check_shards(const char* op, const at::Tensor& whole, const at::Tensor& shard, const std::string& what) const;

  std::string name_;
  std::vector<int64_t> ranks_;
  int64_t index_ = 0;
  std::unique_ptr<BackendHandle> backend_;
  std::shared_ptr<Roster> roster_;
  c10::Device comm_device_{c10::kCPU};
  std::mutex counters_mu_;   // buckets launch on the autograd thread
  CommCounters counters_;
  bool point_to_point_ = false;   // shards exchanged by sends and receives (Gloo)
  int64_t exchanges_ = 0;         // point-to-point exchanges so far: each one's tag
  std::vector<int64_t> sent_, received_;   // pipeline transfers to and from each group rank so far
  SpareBuffers scratch_{4};       // reduce-scatter's receive buffers, reused
};

}  // namespace colossal::dist
