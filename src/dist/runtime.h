// Runtime: this process's place in the job. Joins the rendezvous (c10d's TCPStore, hosted by rank 0),
// learns every rank's host, and builds the process groups of the device mesh once (world, and one per
// mesh dimension larger than 1, always in the same order on every rank so that no two ranks wait on
// each other's groups). A job of one process opens no socket at all; its groups are size-1 no-ops.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "src/dist/group.h"
#include "src/dist/launch_env.h"
#include "src/dist/mesh.h"

namespace colossal::dist {

class Roster;

struct JoinOptions {
  double timeout_s = 300;          // rendezvous and every collective
  std::string iface;               // Gloo's network interface; "" = GLOO_SOCKET_IFNAME, else the route to the master
  std::string backend = "auto";    // auto | gloo | nccl; named explicitly, it runs even in a world of one
  bool cuda = false;               // parameters live on a GPU (auto picks NCCL)
  int cuda_index = 0;              // which GPU this rank uses
};

class Runtime {
 public:
  // Throws Error naming the rank, the master and what to check when the rendezvous fails (busy port,
  // unreachable master, a rank that never joins, a world size or rank given twice).
  static std::unique_ptr<Runtime> join(const WorkerEnv& env, const MeshShape& shape, const JoinOptions& options);

  int64_t rank() const { return env_.rank; }
  int64_t world() const { return env_.world; }
  int64_t local_rank() const { return env_.local_rank; }
  bool is_root() const { return env_.rank == 0; }
  const WorkerEnv& env() const { return env_; }
  const std::string& host() const;
  std::string who(int64_t rank) const;   // "rank 3 (node gpu02)"
  const MeshLayout& mesh() const { return mesh_; }
  const std::string& backend_name() const { return backend_name_; }

  Group& world_group() { return *world_; }
  Group& group(Dim d) { return *groups_[static_cast<size_t>(d)]; }
  // The ranks holding the same parameters: data-parallel and sequence-parallel ones together (each has
  // other tokens of the same weights), the group gradients are reduced over and ZeRO shards across. The
  // dp group itself when the sequence is not split.
  Group& replicas() { return replicas_ ? *replicas_ : group(Dim::dp); }
  // With a tensor grid (mesh.h: 2D's q x q), the ranks of this rank's tensor group that differ from it
  // only along grid axis `axis` (2D: axis 0 = its column of the grid, axis 1 = its row).
  Group& tensor_axis(size_t axis) { return *tensor_axes_.at(axis); }
  size_t tensor_axes() const { return tensor_axes_.size(); }

  // Counters of every group since the last take (then reset).
  CommCounters take_counters();

 private:
  Runtime(WorkerEnv env, MeshShape shape) : env_(std::move(env)), mesh_(shape) {}
  WorkerEnv env_;
  MeshLayout mesh_;
  std::string backend_name_ = "none";
  // Declared before the groups, so destroyed after them: a group's failure message asks the roster.
  std::shared_ptr<Roster> roster_;
  std::shared_ptr<Group> world_;
  std::vector<std::shared_ptr<Group>> groups_;   // indexed by Dim
  std::shared_ptr<Group> replicas_;              // dp x sp, when sp > 1
  std::vector<std::shared_ptr<Group>> tensor_axes_;   // by grid axis, with a tensor grid
};

// The number of intra-op threads a worker should use (launch_env.h's rule applied to this machine:
// SLURM_CPUS_PER_TASK, the affinity mask, or the node's cores over the local ranks).
int64_t threads_for_worker(const WorkerEnv& env);
// Sets LibTorch's intra-op threads to that, unless OMP_NUM_THREADS names them (before any ATen work starts
// its pool). Workers that each kept every core's worth of spinning OpenMP threads took turns on the cores.
void use_worker_threads(const WorkerEnv& env);

}  // namespace colossal::dist
