// Fuzz target: the launch environment a worker reads (launch_env.h). The input's first line is a SLURM
// host list, its second a per-node task count spec, and the rest NAME=value lines forming an environment.
// The host list expands (capped) and its first host must agree with first_host's cheap path; the task
// spec is read for a few node indices; the environment is read as a worker would, and worker_threads
// priced on it.
#include <string>
#include <string_view>

#include "src/dist/launch_env.h"
#include "tests/fuzz/fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> lines;
  size_t at = 0;
  while (at <= text.size()) {
    size_t nl = text.find('\n', at);
    if (nl == std::string::npos) nl = text.size();
    lines.push_back(text.substr(at, nl - at));
    at = nl + 1;
  }
  using namespace colossal::dist;
  const std::string list = lines[0];
  std::vector<std::string> hosts;
  bool expanded = false;
  colossal::fuzz::reject_only([&] {
    hosts = expand_nodelist(list, 4096);
    expanded = true;
  });
  colossal::fuzz::reject_only([&] {
    const std::string first = first_host(list);
    if (expanded && (hosts.empty() || hosts.front() != first)) {
      std::fprintf(stderr, "fuzz: first_host(\"%s\") = \"%s\" but expand_nodelist starts with \"%s\"\n", list.c_str(),
                   first.c_str(), hosts.empty() ? "(nothing)" : hosts.front().c_str());
      std::abort();
    }
  });
  if (lines.size() > 1)
    for (int64_t node : {0, 1, 3, 1000})
      colossal::fuzz::reject_only([&] { (void)tasks_on_node(lines[1], node); });
  std::map<std::string, std::string> vars;
  for (size_t i = 2; i < lines.size(); ++i) {
    const size_t eq = lines[i].find('=');
    if (eq != std::string::npos) vars[lines[i].substr(0, eq)] = lines[i].substr(eq + 1);
  }
  const auto env = map_env(vars);
  colossal::fuzz::reject_only([&] {
    const WorkerEnv w = worker_env(env);
    if (w.rank < 0 || w.rank >= w.world || w.local_rank >= w.local_world || w.master_port < 1 || w.master_port > 65535) {
      std::fprintf(stderr, "fuzz: worker_env accepted an inconsistent environment\n");
      std::abort();
    }
    (void)worker_threads(env, 2, 4, w.local_world);
  });
  return 0;
}
