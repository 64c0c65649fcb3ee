// Launcher: see launcher.h.
#include "src/dist/launcher.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <spdlog/spdlog.h>
#include <thread>

#include "src/core/device.h"
#include "src/core/error.h"

namespace fs = std::filesystem;

namespace colossal::dist {
namespace {

using Clock = std::chrono::steady_clock;

std::atomic<int> g_signal{0};       // last SIGINT/SIGTERM the launcher received
std::atomic<int> g_signal_count{0};
extern "C" void on_launcher_signal(int sig) {
  g_signal = sig;
  ++g_signal_count;
}

}  // namespace

int free_local_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw Error("launcher: cannot open a socket to find a free port: " + std::string(std::strerror(errno)));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    close(fd);
    throw Error("launcher: cannot find a free port: " + std::string(std::strerror(errno)) + " (give one with --master-port)");
  }
  close(fd);
  return ntohs(a.sin_port);
}

char process_state(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  std::getline(in, stat);
  const size_t close = stat.rfind(')');   // the name in parentheses may itself hold spaces
  return close != std::string::npos && close + 2 < stat.size() ? stat[close + 2] : '\0';
}

namespace {

std::string failure_report_path() {
  const char* p = std::getenv("COLOSSAL_FAILURE_FILE");
  return p ? p : "";
}

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? "SIG" + std::string(abbrev) : "signal " + std::to_string(sig);
}

struct Worker {
  int64_t rank = 0, local_rank = 0;
  pid_t pid = -1;
  bool running = false;
  int status = 0;          // waitpid status once ended
  std::string report;      // the failure report file
};

pid_t spawn(const Worker& w, const LaunchOptions& o, int port, const std::vector<std::string>& args) {
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) throw Error("launcher: fork failed: " + std::string(std::strerror(errno)));
  if (pid > 0) return pid;
  // Child. Its own process group: a Ctrl-C at the terminal reaches the launcher once, which forwards it
  // (the group would otherwise get it twice, and a second Ctrl-C means "stop without saving").
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(1);   // the launcher died before the line above took effect
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  const int64_t world = o.nnodes * o.nproc_per_node;
  setenv("RANK", std::to_string(w.rank).c_str(), 1);
  setenv("LOCAL_RANK", std::to_string(w.local_rank).c_str(), 1);
  setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
  setenv("LOCAL_WORLD_SIZE", std::to_string(o.nproc_per_node).c_str(), 1);
  setenv("GROUP_RANK", std::to_string(o.node_rank).c_str(), 1);
  setenv("MASTER_ADDR", o.master_addr.c_str(), 1);
  setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
  setenv("COLOSSAL_FAILURE_FILE", w.report.c_str(), 1);
  if (!o.iface.empty()) setenv("GLOO_SOCKET_IFNAME", o.iface.c_str(), 1);
  std::vector<std::string> argv{"colossal"};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> cargv;
  for (auto& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  execv("/proc/self/exe", cargv.data());
  std::fprintf(stderr, "error: launcher: cannot start worker %lld: %s\n", static_cast<long long>(w.rank), std::strerror(errno));
  _exit(127);
}

std::string read_report(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// A worker the kernel reports as stopped (SIGSTOP, a debugger): it cannot answer, so the others time out.
bool is_stopped(pid_t pid) {
  const char state = process_state(pid);
  return state == 'T' || state == 't';
}

bool bad(int status) { return !(WIFEXITED(status) && WEXITSTATUS(status) == 0); }

std::string how_it_ended(const Worker& w, const std::string& host) {
  const std::string who = "rank " + std::to_string(w.rank) + " (node " + host + ", pid " + std::to_string(w.pid) + ")";
  if (WIFSIGNALED(w.status))
    return who + " was killed by " + signal_name(WTERMSIG(w.status));
  const std::string report = read_report(w.report);
  if (!report.empty()) return report + " [reported by " + who + "]";
  return who + " exited with code " + std::to_string(WEXITSTATUS(w.status));
}

// One attempt of the job: spawn, supervise, stop. Returns the exit code and fills `failure`.
int run_attempt(const LaunchOptions& o, int64_t attempt, std::string& failure) {
  const int port = o.master_port > 0 ? o.master_port : free_local_port();
  const std::string host = host_name();
  std::vector<Worker> workers(static_cast<size_t>(o.nproc_per_node));
  fs::create_directories(o.state_dir);
  const auto args = o.worker_args(attempt);
  for (int64_t i = 0; i < o.nproc_per_node; ++i) {
    Worker& w = workers[static_cast<size_t>(i)];
    w.local_rank = i;
    w.rank = o.node_rank * o.nproc_per_node + i;
    w.report = (fs::path(o.state_dir) / ("rank-" + std::to_string(w.rank) + ".failure")).string();
    fs::remove(w.report);
    w.pid = spawn(w, o, port, args);
    w.running = true;
  }
  spdlog::info("launcher: {} worker(s) on {} (ranks {}-{} of {}), master {}:{}", o.nproc_per_node, host,
               o.node_rank * o.nproc_per_node, (o.node_rank + 1) * o.nproc_per_node - 1, o.nnodes * o.nproc_per_node,
               o.master_addr, port);

  const Worker* first_bad = nullptr;
  std::string stopped_note;
  int forwarded = 0;
  bool stopping = false;
  Clock::time_point stop_at{};
  auto running = [&] {
    int n = 0;
    for (auto& w : workers) n += w.running;
    return n;
  };
  auto signal_all = [&](int sig) {
    for (auto& w : workers)
      if (w.running) kill(w.pid, sig);
  };
  while (running() > 0) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      for (auto& w : workers)
        if (w.pid == pid && w.running) {
          w.running = false;
          w.status = status;
          if (bad(status) && !first_bad && !stopping) first_bad = &w;
        }
      continue;
    }
    // Forward the user's Ctrl-C / SIGTERM: workers save and stop (a second one stops them at once).
    while (forwarded < g_signal_count) {
      ++forwarded;
      signal_all(g_signal == SIGTERM ? SIGTERM : SIGINT);
    }
    if (first_bad && !stopping) {
      // A rank that gave up (exited with an error) may have been waiting for one frozen here; a rank
      // killed by a signal is the cause itself (and the others may be stopped only for a moment, as
      // LeakSanitizer stops a process's threads while it checks for leaks on the way out).
      const bool gave_up = WIFEXITED(first_bad->status);
      for (auto& w : workers)   // the rank the others were waiting for, if it is frozen here
        if (gave_up && w.running && is_stopped(w.pid))
          stopped_note = "rank " + std::to_string(w.rank) + " (node " + host + ", pid " + std::to_string(w.pid) +
                         ") was found stopped (SIGSTOP or a debugger) and never answered";
      stopping = true;
      stop_at = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(o.grace_s * 1000));
      signal_all(SIGTERM);
      signal_all(SIGCONT);   // a stopped worker only sees SIGTERM once it runs again
    }
    if (stopping && Clock::now() >= stop_at) signal_all(SIGKILL);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (!first_bad) {
    for (auto& w : workers)   // a worker that ended badly while the job was being stopped by the user
      if (bad(w.status) && !first_bad) first_bad = &w;
    if (!first_bad) return 0;
  }
  failure = stopped_note.empty() ? how_it_ended(*first_bad, host) : stopped_note + "; " + how_it_ended(*first_bad, host);
  if (WIFSIGNALED(first_bad->status)) return 128 + WTERMSIG(first_bad->status);
  return WEXITSTATUS(first_bad->status) != 0 ? WEXITSTATUS(first_bad->status) : 1;
}

}  // namespace

int run_launcher(const LaunchOptions& o) {
  struct sigaction sa {};
  sa.sa_handler = on_launcher_signal;
  sigemptyset(&sa.sa_mask);
  struct sigaction old_int {}, old_term {};
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  int code = 0;
  for (int64_t attempt = 0;; ++attempt) {
    std::string failure;
    code = run_attempt(o, attempt, failure);
    if (code == 0) break;
    const bool user_stop = g_signal_count > 0;
    if (code == 130 && user_stop) break;   // interrupted by the user after saving: not a failure
    std::fprintf(stderr, "error: %s; the job was stopped (attempt %lld of %lld)\n", failure.c_str(),
                 static_cast<long long>(attempt + 1), static_cast<long long>(o.max_restarts + 1));
    if (user_stop || attempt >= o.max_restarts) break;
    spdlog::warn("launcher: restarting every worker from the latest checkpoint ({} restart(s) left)", o.max_restarts - attempt);
  }
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  return code;
}

void write_failure_report(const std::string& line) {
  const std::string path = failure_report_path();
  if (path.empty()) return;
  std::ofstream out(path, std::ios::trunc);
  out << line << "\n";
}

}  // namespace colossal::dist
