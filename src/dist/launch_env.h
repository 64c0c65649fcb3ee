// Where a worker learns its place in the job: torchrun's variables (which colossal's own launcher sets
// too) or SLURM's, including SLURM's compressed host lists and per-node task counts. Pure parsing over
// an environment lookup, so tests and the fuzz target feed it any text.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace colossal::dist {

// Expands a SLURM host list as SLURM_JOB_NODELIST writes it: "gpu[01-04,07],cpu-a[1-2]" -> gpu01 gpu02
// gpu03 gpu04 gpu07 cpu-a1 cpu-a2. Zero padding follows the written width of a range's lower bound;
// several bracket groups in one name expand as a product ("r[1-2]n[3-4]" -> r1n3 r1n4 r2n3 r2n4).
// Error naming the text, the character and what was expected; never more than `limit` hosts.
std::vector<std::string> expand_nodelist(std::string_view list, size_t limit = size_t{1} << 20);
// The first host without expanding the rest (a 100k-node list stays cheap).
std::string first_host(std::string_view list);
// SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE: "2(x3),1" = nodes 0-2 run 2 tasks, node 3 runs 1.
int64_t tasks_on_node(std::string_view spec, int64_t node_index);

using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;
EnvLookup process_env();                                   // std::getenv
EnvLookup map_env(std::map<std::string, std::string> vars);  // tests and the fuzz target

struct WorkerEnv {
  std::string source = "single";   // single | torchrun | slurm
  int64_t rank = 0, world = 1, local_rank = 0, local_world = 1, node_rank = 0, nnodes = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // torchrun's agent may host the store itself (TORCHELASTIC_USE_AGENT_STORE=True): then rank 0 joins as
  // a client too, and each restart (TORCHELASTIC_RESTART_COUNT) keeps its keys apart in the long-lived store.
  bool agent_store = false;
  int64_t restart_count = 0;
};
// torchrun's variables win whenever RANK and WORLD_SIZE are set (torchrun run inside srun sets them);
// otherwise SLURM's inside an srun step (SLURM_PROCID, SLURM_NTASKS and SLURM_STEP_ID set: the batch
// script itself is not a worker); otherwise one process. Every value is checked, and an error names the
// variable, its value and what would be valid.
WorkerEnv worker_env(const EnvLookup& env);

// Threads one worker should use: SLURM_CPUS_PER_TASK when set; else the affinity mask's size when it is
// narrower than the node (the scheduler pinned us); else the node's cores over the local ranks (>= 1).
int64_t worker_threads(const EnvLookup& env, int64_t affinity_cpus, int64_t node_cpus, int64_t local_world);

}  // namespace colossal::dist
