// Launch environment parsing: see launch_env.h.
#include "src/dist/launch_env.h"

#include <cstdlib>
#include <limits>

#include "src/core/error.h"
#include "src/core/text.h"

namespace colossal::dist {
namespace {

constexpr int64_t kMaxNumber = int64_t{1} << 40;   // far above any rank, port or node index

// A non-negative decimal number without sign, spaces or junk (core's parse_whole), at most kMaxNumber.
std::optional<int64_t> parse_count(std::string_view s) {
  const auto v = parse_whole(std::string(s));
  if (!v || *v > static_cast<uint64_t>(kMaxNumber)) return std::nullopt;
  return static_cast<int64_t>(*v);
}

// `s` in double quotes for an error message, control characters shown as '?', long text cut. Built by
// appending (GCC 12 flags `"\"" + std::string` chains with a false -Wstringop-overflow).
std::string in_quotes(std::string_view s) {
  std::string out(1, '"');
  for (char c : s) {
    if (out.size() > 80) {
      out.append("...");
      break;
    }
    out.push_back((static_cast<unsigned char>(c) < 0x20 || c == 0x7f) ? '?' : c);
  }
  out.push_back('"');
  return out;
}

[[noreturn]] void nodelist_error(std::string_view list, size_t at, const std::string& what) {
  throw Error("SLURM_JOB_NODELIST " + in_quotes(list) + ": " + what + " at character " + std::to_string(at + 1));
}

// One bracket group's items, e.g. "01-04,07" -> {"01","02","03","04","07"} (padded like the lower bound).
std::vector<std::string> expand_group(std::string_view list, size_t begin, std::string_view body, size_t limit,
                                      bool first_only) {
  std::vector<std::string> out;
  if (body.empty()) nodelist_error(list, begin, "empty brackets (write a number or range, e.g. [1-4])");
  size_t at = 0;
  while (at <= body.size()) {
    size_t comma = body.find(',', at);
    if (comma == std::string_view::npos) comma = body.size();
    std::string_view item = body.substr(at, comma - at);
    const size_t where = begin + 1 + at;
    if (item.empty()) nodelist_error(list, where, "empty item in brackets");
    const size_t dash = item.find('-');
    std::string_view lo = item.substr(0, dash), hi = dash == std::string_view::npos ? lo : item.substr(dash + 1);
    auto a = parse_count(lo), b = parse_count(hi);
    if (!a || !b) nodelist_error(list, where, in_quotes(item) + " is not a number or low-high range of numbers");
    if (*b < *a) nodelist_error(list, where, "range " + std::string(item) + " runs backwards (write low-high)");
    if (first_only) {
      if (out.empty()) out.push_back(std::string(lo));   // the written lower bound, padding included
      at = comma + 1;
      continue;
    }
    if (static_cast<uint64_t>(*b - *a) >= limit - out.size())
      nodelist_error(list, where, "expands to more than " + std::to_string(limit) + " hosts");
    for (int64_t v = *a; v <= *b; ++v) {
      std::string n = std::to_string(v);
      if (n.size() < lo.size()) n.insert(0, lo.size() - n.size(), '0');
      out.push_back(std::move(n));
    }
    at = comma + 1;
  }
  return out;
}

// Splits a list at top-level commas (not inside brackets), checking bracket balance.
std::vector<std::pair<size_t, std::string_view>> split_hosts(std::string_view list) {
  std::vector<std::pair<size_t, std::string_view>> out;
  if (list.empty()) throw Error("SLURM_JOB_NODELIST is empty (SLURM sets it to the job's hosts, e.g. gpu[01-04])");
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i < list.size(); ++i) {
    const char c = list[i];
    if (c == '[') {
      if (depth) nodelist_error(list, i, "nested '['");
      depth = 1;
    } else if (c == ']') {
      if (!depth) nodelist_error(list, i, "']' without '['");
      depth = 0;
    } else if (c == ',' && !depth) {
      if (i == start) nodelist_error(list, i, "empty host name");
      if (list[start] == '[') nodelist_error(list, start, "a host name cannot start with '['");
      out.push_back({start, list.substr(start, i - start)});
      start = i + 1;
    } else if (static_cast<unsigned char>(c) <= ' ' || c == 0x7f) {
      nodelist_error(list, i, "whitespace or a control character (host lists have none)");
    }
  }
  if (depth) nodelist_error(list, list.size() - 1, "'[' without ']'");
  if (start >= list.size()) nodelist_error(list, list.size() - 1, "empty host name");
  if (list[start] == '[') nodelist_error(list, start, "a host name cannot start with '['");
  out.push_back({start, list.substr(start)});
  return out;
}

// Expands one host pattern ("r[1-2]n[3-4]"), at most `limit` names; `first_only` stops at the first.
std::vector<std::string> expand_host(std::string_view list, size_t offset, std::string_view host, size_t limit, bool first_only) {
  std::vector<std::string> names{""};
  size_t at = 0;
  while (at < host.size()) {
    const size_t open = host.find('[', at);
    const std::string_view plain = host.substr(at, open == std::string_view::npos ? std::string_view::npos : open - at);
    for (auto& n : names) n += plain;
    if (open == std::string_view::npos) break;
    const size_t close = host.find(']', open);   // balanced: split_hosts checked
    auto items = expand_group(list, offset + open, host.substr(open + 1, close - open - 1), limit, first_only);
    if (items.size() > limit / names.size()) nodelist_error(list, offset + open, "expands to more than " + std::to_string(limit) + " hosts");
    std::vector<std::string> next;
    next.reserve(names.size() * items.size());
    for (const auto& n : names)
      for (const auto& i : items) next.push_back(n + i);
    names = std::move(next);
    at = close + 1;
  }
  return names;
}

int64_t env_number(const EnvLookup& env, const std::string& name, const std::string& hint, int64_t min, int64_t max) {
  const auto v = env(name);
  const auto n = v ? parse_count(*v) : std::nullopt;
  if (!n) throw Error("environment: " + name + "=" + in_quotes(v.value_or("")) + " is not a whole number (" + hint + ")");
  if (*n < min || *n > max)
    throw Error("environment: " + name + "=" + std::to_string(*n) + " is out of range (" + hint + ")");
  return *n;
}

int64_t env_number_or(const EnvLookup& env, const std::string& name, int64_t fallback, const std::string& hint, int64_t min, int64_t max) {
  return env(name) ? env_number(env, name, hint, min, max) : fallback;
}

void check_below(const std::string& a, int64_t av, const std::string& b, int64_t bv, const std::string& what) {
  if (av >= bv)
    throw Error("environment: " + a + "=" + std::to_string(av) + " but " + b + "=" + std::to_string(bv) + " (" + what + ")");
}

std::string checked_addr(const std::string& name, const std::string& v) {
  if (v.empty() || v.size() > 253) throw Error("environment: " + name + "=" + in_quotes(v) + " is not a host name or address");
  for (char c : v)
    if (static_cast<unsigned char>(c) <= ' ' || c == 0x7f)
      throw Error("environment: " + name + "=" + in_quotes(v) + " contains whitespace or a control character");
  return v;
}

}  // namespace

std::vector<std::string> expand_nodelist(std::string_view list, size_t limit) {
  if (limit == 0) limit = 1;
  std::vector<std::string> out;
  for (const auto& [offset, host] : split_hosts(list)) {
    auto names = expand_host(list, offset, host, limit - out.size(), false);
    if (names.size() > limit - out.size()) nodelist_error(list, offset, "expands to more than " + std::to_string(limit) + " hosts");
    for (auto& n : names) out.push_back(std::move(n));
  }
  return out;
}

std::string first_host(std::string_view list) {
  const auto hosts = split_hosts(list);
  const auto& [offset, host] = hosts.front();
  return expand_host(list, offset, host, 1, true).front();
}

int64_t tasks_on_node(std::string_view spec, int64_t node_index) {
  auto bad = [&](const std::string& what) -> int64_t {
    throw Error("SLURM_STEP_TASKS_PER_NODE " + in_quotes(spec) + ": " + what + " (SLURM writes counts like 2(x3),1)");
  };
  if (node_index < 0) return bad("node index " + std::to_string(node_index) + " is negative");
  int64_t node = 0, found = 0;
  size_t at = 0;
  if (spec.empty()) return bad("is empty");
  while (at <= spec.size()) {
    size_t comma = spec.find(',', at);
    if (comma == std::string_view::npos) comma = spec.size();
    std::string_view item = spec.substr(at, comma - at);
    int64_t repeat = 1;
    const size_t paren = item.find('(');
    if (paren != std::string_view::npos) {
      if (item.size() < paren + 4 || item.substr(paren, 2) != "(x" || item.back() != ')') bad(in_quotes(item) + " is malformed");
      auto r = parse_count(item.substr(paren + 2, item.size() - paren - 3));
      if (!r || *r < 1) bad(in_quotes(item) + " has a bad repeat count");
      repeat = *r;
      item = item.substr(0, paren);
    }
    auto count = parse_count(item);
    if (!count || *count < 1) bad(in_quotes(item) + " is not a task count");
    if (!found && node_index < node + repeat) found = *count;   // the whole spec is still checked
    node = std::min(node + repeat, kMaxNumber);
    at = comma + 1;
  }
  if (found) return found;
  return bad("has " + std::to_string(node) + " node(s), no node " + std::to_string(node_index));
}

EnvLookup process_env() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    return v ? std::optional<std::string>(v) : std::nullopt;
  };
}

EnvLookup map_env(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    return it == vars.end() ? std::nullopt : std::optional<std::string>(it->second);
  };
}

WorkerEnv worker_env(const EnvLookup& env) {
  WorkerEnv w;
  const int64_t kMaxWorld = int64_t{1} << 24;
  if (env("RANK") && env("WORLD_SIZE")) {
    w.source = "torchrun";
    w.world = env_number(env, "WORLD_SIZE", "torchrun sets the number of workers, 1 or more", 1, kMaxWorld);
    w.rank = env_number(env, "RANK", "torchrun sets 0..WORLD_SIZE-1", 0, kMaxWorld);
    check_below("RANK", w.rank, "WORLD_SIZE", w.world, "a rank must be below the world size");
    w.local_world = env_number_or(env, "LOCAL_WORLD_SIZE", env("LOCAL_RANK") ? w.world : 1,
                                  "torchrun sets the workers per node, 1 or more", 1, kMaxWorld);
    w.local_rank = env_number_or(env, "LOCAL_RANK", env("LOCAL_WORLD_SIZE") ? w.rank % w.local_world : 0,
                                 "torchrun sets 0..LOCAL_WORLD_SIZE-1", 0, kMaxWorld);
    check_below("LOCAL_RANK", w.local_rank, "LOCAL_WORLD_SIZE", w.local_world, "a local rank must be below the local world size");
    if (w.world % w.local_world != 0)
      throw Error("environment: WORLD_SIZE=" + std::to_string(w.world) + " is not a multiple of LOCAL_WORLD_SIZE=" +
                  std::to_string(w.local_world) + " (every node runs the same number of workers)");
    w.nnodes = w.world / w.local_world;
    w.node_rank = env_number_or(env, "GROUP_RANK", w.rank / w.local_world, "torchrun sets the node's index", 0, kMaxWorld);
    check_below("GROUP_RANK", w.node_rank, "nodes (WORLD_SIZE/LOCAL_WORLD_SIZE)", w.nnodes, "a node index must be below the node count");
    if (auto a = env("MASTER_ADDR")) w.master_addr = checked_addr("MASTER_ADDR", *a);
    else if (w.world > 1) throw Error("environment: RANK and WORLD_SIZE are set but MASTER_ADDR is not (torchrun sets all three)");
    w.master_port = static_cast<int>(env_number_or(env, "MASTER_PORT", 29500, "a TCP port, 1..65535", 1, 65535));
    w.agent_store = env("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True";
    w.restart_count = env_number_or(env, "TORCHELASTIC_RESTART_COUNT", 0, "torchrun counts restarts from 0", 0, kMaxNumber);
    return w;
  }
  if (env("SLURM_PROCID") && env("SLURM_NTASKS") && (env("SLURM_STEP_ID") || env("SLURM_STEPID"))) {
    w.source = "slurm";
    w.world = env_number(env, "SLURM_NTASKS", "SLURM sets the number of tasks, 1 or more", 1, kMaxWorld);
    w.rank = env_number(env, "SLURM_PROCID", "SLURM sets 0..SLURM_NTASKS-1", 0, kMaxWorld);
    check_below("SLURM_PROCID", w.rank, "SLURM_NTASKS", w.world, "a task id must be below the task count");
    w.node_rank = env_number_or(env, "SLURM_NODEID", 0, "SLURM sets the node's index in the job", 0, kMaxWorld);
    for (const char* name : {"SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"})
      if (env(name)) {
        w.nnodes = env_number(env, name, "SLURM sets the number of nodes, 1 or more", 1, kMaxWorld);
        break;
      }
    check_below("SLURM_NODEID", w.node_rank, "nodes", w.nnodes, "a node index must be below the node count");
    w.local_world = 1;
    for (const char* name : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"})
      if (auto spec = env(name)) {
        w.local_world = tasks_on_node(*spec, w.node_rank);
        break;
      }
    w.local_rank = env_number_or(env, "SLURM_LOCALID", 0, "SLURM sets the task's index on its node", 0, kMaxWorld);
    check_below("SLURM_LOCALID", w.local_rank, "tasks on this node", w.local_world, "a local id must be below the node's task count");
    if (auto a = env("MASTER_ADDR")) {
      w.master_addr = checked_addr("MASTER_ADDR", *a);
    } else {
      auto list = env("SLURM_STEP_NODELIST");
      if (!list) list = env("SLURM_JOB_NODELIST");
      if (!list) throw Error("environment: inside an srun step but neither SLURM_STEP_NODELIST nor SLURM_JOB_NODELIST is set (or set MASTER_ADDR)");
      w.master_addr = first_host(*list);
    }
    // Every task of a job must agree on the port without talking first: derive it from the job id, so
    // two jobs sharing a node do not collide (MASTER_PORT overrides).
    if (env("MASTER_PORT")) {
      w.master_port = static_cast<int>(env_number(env, "MASTER_PORT", "a TCP port, 1..65535", 1, 65535));
    } else {
      const int64_t job = env_number_or(env, "SLURM_JOB_ID", 0, "SLURM sets the job id", 0, kMaxNumber);
      w.master_port = static_cast<int>(20000 + job % 10000);
    }
    return w;
  }
  return w;
}

int64_t worker_threads(const EnvLookup& env, int64_t affinity_cpus, int64_t node_cpus, int64_t local_world) {
  if (env("SLURM_CPUS_PER_TASK"))
    return env_number(env, "SLURM_CPUS_PER_TASK", "SLURM sets the CPUs given to each task, 1 or more", 1, 1 << 20);
  node_cpus = std::max<int64_t>(1, node_cpus);
  if (affinity_cpus > 0 && affinity_cpus < node_cpus) return affinity_cpus;
  return std::max<int64_t>(1, node_cpus / std::max<int64_t>(1, local_world));
}

}  // namespace colossal::dist
