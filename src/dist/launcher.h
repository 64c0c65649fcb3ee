// Launcher: `colossal train recipe.toml --nproc-per-node N` spawns N workers of this same binary on
// this node and supervises them, as torchrun does. Each worker gets torchrun's environment (RANK,
// LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT), so a worker cannot
// tell the two launchers apart.
//
// Supervision: when any worker ends badly (non-zero exit or a signal), the others get SIGTERM and, after
// a grace period, SIGKILL; the launcher prints one line naming the failed rank, its node and how it
// ended (the worker's own one-line report when it left one: a rank whose collective timed out names the
// rank that never arrived), and returns non-zero. Workers die with the launcher (PR_SET_PDEATHSIG), so
// killing the launcher leaves no orphan. With max_restarts > 0 the whole job is started again, from the
// latest complete checkpoint, up to that many times (torchrun's elastic restart).
#pragma once
#include <cstdint>
#include <functional>
#include <sys/types.h>
#include <string>
#include <vector>

namespace colossal::dist {

struct LaunchOptions {
  int64_t nproc_per_node = 1;
  int64_t nnodes = 1;
  int64_t node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;          // 0 = a free port of this machine (one node only)
  int64_t max_restarts = 0;
  double grace_s = 5;           // between SIGTERM and SIGKILL when stopping workers
  std::string iface;            // passed to workers as GLOO_SOCKET_IFNAME
  std::string state_dir;        // where workers leave their failure reports
  // The worker's arguments (argv without the program) for attempt 0, 1, ...: a restart adds --resume
  // when a checkpoint exists.
  std::function<std::vector<std::string>(int64_t attempt)> worker_args;
};

// Runs the job to the end; returns the exit code (0 when every worker succeeded).
int run_launcher(const LaunchOptions& options);

// In a worker: leaves the one-line report of why it is ending where its launcher reads it (nothing
// outside a launcher).
void write_failure_report(const std::string& line);

// A TCP port on 127.0.0.1 that was free a moment ago (the rendezvous of a one-node job).
int free_local_port();
// The process's state letter from /proc/<pid>/stat ('R', 'S', 'T' stopped, 'Z' zombie...), '\0' if gone.
char process_state(pid_t pid);

}  // namespace colossal::dist
