// Runtime: see runtime.h.
#include "src/dist/runtime.h"

#include <ATen/Parallel.h>

#include <algorithm>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <thread>
#include <c10/util/Logging.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "src/core/device.h"
#include "src/core/error.h"
#include "src/core/text.h"
#include "src/dist/backend.h"
#include "src/dist/nccl_backend.h"
#include "src/dist/roster.h"

namespace colossal::dist {
namespace {

using Clock = std::chrono::steady_clock;

std::chrono::milliseconds millis(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(std::llround(seconds * 1000)));
}

bool is_loopback(const std::string& addr) {
  return addr == "localhost" || addr.rfind("127.", 0) == 0 || addr == "::1";
}

// The local address the kernel would use to reach the master: a UDP socket connected to it (no packet
// is sent) and asked for its own name. Gloo otherwise resolves this machine's hostname, which Debian
// maps to 127.0.1.1, an address no other node can reach.
std::string route_to(const std::string& master, int port) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  if (getaddrinfo(master.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || !res)
    throw Error("rendezvous: cannot resolve the master address \"" + master +
                "\" (--master-addr / MASTER_ADDR: a host name or IPv4 address of rank 0's node)");
  std::string out;
  const int fd = socket(AF_INET, SOCK_DGRAM, 0);
  if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    sockaddr_in local{};
    socklen_t len = sizeof local;
    char buf[INET_ADDRSTRLEN] = {};
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 && inet_ntop(AF_INET, &local.sin_addr, buf, sizeof buf))
      out = buf;
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(res);
  if (out.empty())
    throw Error("rendezvous: no network route from " + host_name() + " to the master " + master +
                " (pick the interface that reaches it with --iface or GLOO_SOCKET_IFNAME)");
  return out;
}

std::shared_ptr<::gloo::transport::Device> gloo_device(const WorkerEnv& env, const JoinOptions& o) {
  std::string iface = o.iface;
  if (iface.empty())
    if (const char* e = std::getenv("GLOO_SOCKET_IFNAME")) iface = e;
  try {
    if (!iface.empty()) return c10d::ProcessGroupGloo::createDeviceForInterface(iface);
    if (is_loopback(env.master_addr)) return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
    return c10d::ProcessGroupGloo::createDeviceForHostname(route_to(env.master_addr, env.master_port));
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error("rank " + std::to_string(env.rank) + ": cannot open a Gloo device" +
                (iface.empty() ? "" : " on interface \"" + iface + "\"") + ": " + e.what() +
                " (--iface / GLOO_SOCKET_IFNAME name an interface from `ip -brief addr`)");
  }
}

c10::intrusive_ptr<c10d::Store> open_store(const WorkerEnv& env, double timeout_s) {
  c10d::TCPStoreOptions o;
  o.port = static_cast<uint16_t>(env.master_port);
  o.isServer = env.rank == 0 && !env.agent_store;
  o.numWorkers = std::nullopt;   // joining is checked below, with an error naming who is missing
  o.waitWorkers = false;
  o.timeout = millis(timeout_s);
  const std::string where = env.master_addr + ":" + std::to_string(env.master_port);
  try {
    return c10::make_intrusive<c10d::TCPStore>(env.master_addr, o);
  } catch (const std::exception& e) {
    const std::string m = e.what();
    if (env.rank == 0 && (m.find("EADDRINUSE") != std::string::npos || m.find("in use") != std::string::npos))
      throw Error("rendezvous: port " + std::to_string(env.master_port) + " on " + host_name() +
                  " is already in use (another job, or a previous run still closing); pick a free one with "
                  "--master-port or MASTER_PORT");
    if (env.rank == 0)
      throw Error("rendezvous: rank 0 on " + host_name() + " cannot host the store at " + where + ": " +
                  m.substr(0, m.find('\n')));
    throw Error("rendezvous: rank " + std::to_string(env.rank) + " on " + host_name() + " cannot reach the master at " +
                where + " within " + format_number(timeout_s) +
                " s (is rank 0 running, and is --master-addr / MASTER_ADDR an address of its node that this node reaches?)");
  }
}

// Every rank announces its host; rank 0 waits for all of them (naming the missing ranks on timeout)
// and publishes the roster; the others wait for it.
std::vector<std::string> join_ranks(c10d::Store& store, const WorkerEnv& env, double timeout_s) {
  const int64_t claims = store.add("colossal/claim/" + std::to_string(env.rank), 1);
  if (claims > 1)
    throw Error("rendezvous: rank " + std::to_string(env.rank) + " joined twice (two workers were given RANK=" +
                std::to_string(env.rank) + "; each needs its own)");
  store.set("colossal/host/" + std::to_string(env.rank), store_bytes(host_name()));
  store.set("colossal/world/" + std::to_string(env.rank), store_bytes(std::to_string(env.world)));
  const auto deadline = Clock::now() + millis(timeout_s);
  if (env.rank == 0) {
    std::vector<std::string> missing;
    while (true) {
      missing.clear();
      for (int64_t r = 1; r < env.world; ++r)
        if (!store.check({"colossal/host/" + std::to_string(r)})) missing.push_back(std::to_string(r));
      if (missing.empty() || Clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (!missing.empty())
      throw Error("rendezvous: rank" + std::string(missing.size() > 1 ? "s " : " ") + join(missing, ", ") + " of " +
                  std::to_string(env.world) + " never joined within " + format_number(timeout_s) + " s (master " +
                  env.master_addr + ":" + std::to_string(env.master_port) + "; were they started with the same world size and master?)");
    std::string hosts;
    for (int64_t r = 0; r < env.world; ++r) {
      const std::string w = store_text(store.get("colossal/world/" + std::to_string(r)));
      if (w != std::to_string(env.world))
        throw Error("rendezvous: rank " + std::to_string(r) + " was started with world size " + w + ", rank 0 with " +
                    std::to_string(env.world) + " (every worker needs the same WORLD_SIZE / --nnodes x --nproc-per-node)");
      hosts += (r ? "\n" : "") + store_text(store.get("colossal/host/" + std::to_string(r)));
    }
    store.set("colossal/roster", store_bytes(hosts));
  } else {
    try {
      store.wait({"colossal/roster"}, millis(timeout_s));
    } catch (const std::exception&) {
      throw Error("rendezvous: rank " + std::to_string(env.rank) + " on " + host_name() + " waited " +
                  format_number(timeout_s) + " s for the other ranks to join (rank 0 at " + env.master_addr + ":" +
                  std::to_string(env.master_port) + " did not see all " + std::to_string(env.world) + ")");
    }
  }
  std::vector<std::string> hosts;
  const std::string all = store_text(store.get("colossal/roster"));
  size_t at = 0;
  while (at <= all.size()) {
    size_t nl = all.find('\n', at);
    if (nl == std::string::npos) nl = all.size();
    hosts.push_back(all.substr(at, nl - at));
    at = nl + 1;
  }
  return hosts;
}

}  // namespace

std::unique_ptr<Runtime> Runtime::join(const WorkerEnv& env, const MeshShape& shape, const JoinOptions& o) {
  if (shape.world() != env.world)
    throw Error("mesh " + shape.describe() + " has " + std::to_string(shape.world()) + " ranks but the world has " +
                std::to_string(env.world));
  std::unique_ptr<Runtime> rt(new Runtime(env, shape));
  rt->groups_.resize(kDims.size());
  if (env.world == 1 && o.backend == "auto") {   // one process: no store, no sockets, no-op groups
    rt->roster_ = std::make_shared<Roster>(nullptr, 0, std::vector<std::string>{host_name()});
    rt->world_ = std::make_shared<Group>("world");
    for (Dim d : kDims) rt->groups_[static_cast<size_t>(d)] = std::make_shared<Group>(dim_name(d));
    return rt;
  }

  // c10d logs every connection retry and timeout with a stack trace; each of those ends here in one
  // line that names the rank and what to check, so its own chatter is kept for TORCH_CPP_LOG_LEVEL users.
  if (!std::getenv("TORCH_CPP_LOG_LEVEL")) FLAGS_caffe2_log_level = 3;
  StoreHandle store;
  std::vector<std::string> hosts{host_name()};
  if (env.world == 1) {   // a backend named explicitly runs even alone (how NCCL is checked on one GPU)
    store.store = c10::make_intrusive<c10d::HashStore>();
  } else {
    store.store = open_store(env, o.timeout_s);
    if (env.agent_store)   // a store that outlives this attempt: this attempt's keys under their own prefix
      store.store = c10::make_intrusive<c10d::PrefixStore>("colossal/attempt-" + std::to_string(env.restart_count), store.store);
    hosts = join_ranks(*store.store, env, o.timeout_s);
  }
  rt->roster_ = std::make_shared<Roster>(&store, env.rank, hosts);

  const bool nccl = o.backend == "nccl" || (o.backend == "auto" && o.cuda);
  rt->backend_name_ = nccl ? "nccl" : "gloo";
  const auto timeout = millis(o.timeout_s);
  std::shared_ptr<::gloo::transport::Device> device = nccl ? nullptr : gloo_device(env, o);
  auto make = [&](const std::string& prefix, int64_t rank, int64_t size) {
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>("colossal/pg/" + prefix, store.store);
    auto h = std::make_unique<BackendHandle>();
    try {
      if (nccl) {
        h->pg = make_nccl_backend(prefixed, rank, size, timeout);
      } else {
        auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
        opts->devices.push_back(device);
        h->pg = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, static_cast<int>(rank), static_cast<int>(size), opts);
      }
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      std::string m = e.what();
      throw Error("rank " + std::to_string(env.rank) + " (node " + host_name() + "): connecting group " + prefix + " (" +
                  std::to_string(size) + " ranks) failed: " + m.substr(0, m.find('\n')) +
                  (nccl ? "" : " (on several nodes, check --iface / GLOO_SOCKET_IFNAME names an interface that reaches the others)"));
    }
    return h;
  };

  std::vector<int64_t> all(static_cast<size_t>(env.world));
  for (int64_t r = 0; r < env.world; ++r) all[static_cast<size_t>(r)] = r;
  auto world_backend = make("world", env.rank, env.world);
  auto world_pg = world_backend->pg;
  const c10::Device comm_device = nccl ? c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(o.cuda_index)) : c10::Device(c10::kCPU);
  rt->world_ = std::make_shared<Group>("world", all, env.rank, std::move(world_backend), rt->roster_, comm_device);
  for (Dim d : kDims) {   // the same order on every rank
    const std::string name = dim_name(d);
    auto ranks = rt->mesh_.group_ranks(env.rank, d);
    auto& slot = rt->groups_[static_cast<size_t>(d)];
    if (ranks.size() == 1 && env.world > 1) {
      slot = std::make_shared<Group>(name);
      continue;
    }
    const int64_t index = rt->mesh_.coordinate(env.rank, d);
    std::unique_ptr<BackendHandle> h;
    if (ranks == all) {   // the whole world: share its connections
      h = std::make_unique<BackendHandle>();
      h->pg = world_pg;
    } else {
      h = make(name + "/" + std::to_string(rt->mesh_.group_index(env.rank, d)), index, static_cast<int64_t>(ranks.size()));
    }
    slot = std::make_shared<Group>(name, ranks, index, std::move(h), rt->roster_, comm_device);
  }
  // The tensor grid's axes: within this rank's tensor group, the ranks differing only in one digit of
  // the tp coordinate (the first axis the most significant).
  const auto& grid = shape.tensor_grid;
  for (size_t a = 0; a < grid.size(); ++a) {
    int64_t stride = 1;
    for (size_t b = a + 1; b < grid.size(); ++b) stride *= grid[b];
    const int64_t t = rt->mesh_.coordinate(env.rank, Dim::tp), digit = (t / stride) % grid[a];
    const int64_t first = env.rank - digit * stride;   // tp is the innermost mesh dimension: tp offsets are rank offsets
    std::vector<int64_t> ranks;
    for (int64_t i = 0; i < grid[a]; ++i) ranks.push_back(first + i * stride);
    const std::string name = "tp" + std::to_string(a);
    if (grid[a] == 1) {
      rt->tensor_axes_.push_back(std::make_shared<Group>(name));
      continue;
    }
    auto h = make(name + "/" + std::to_string(first), digit, grid[a]);
    rt->tensor_axes_.push_back(std::make_shared<Group>(name, ranks, digit, std::move(h), rt->roster_, comm_device));
  }
  if (shape.of(Dim::sp) > 1) {   // dp x sp: the ranks whose pp and tp coordinates are this rank's, in rank order
    const MeshLayout& m = rt->mesh_;
    std::vector<int64_t> ranks;
    for (int64_t r = 0; r < env.world; ++r)
      if (m.coordinate(r, Dim::pp) == m.coordinate(env.rank, Dim::pp) && m.coordinate(r, Dim::tp) == m.coordinate(env.rank, Dim::tp))
        ranks.push_back(r);
    const int64_t index = std::find(ranks.begin(), ranks.end(), env.rank) - ranks.begin();
    std::unique_ptr<BackendHandle> h;
    if (ranks == all) {
      h = std::make_unique<BackendHandle>();
      h->pg = world_pg;
    } else {
      h = make("dp_sp/" + std::to_string(m.coordinate(env.rank, Dim::pp) * shape.of(Dim::tp) + m.coordinate(env.rank, Dim::tp)), index,
               static_cast<int64_t>(ranks.size()));
    }
    rt->replicas_ = std::make_shared<Group>("dp_sp", ranks, index, std::move(h), rt->roster_, comm_device);
  }
  return rt;
}

const std::string& Runtime::host() const { return roster_->host(env_.rank); }
std::string Runtime::who(int64_t rank) const { return roster_->who(rank); }

CommCounters Runtime::take_counters() {
  CommCounters c = world_->take_counters();
  if (replicas_) c += replicas_->take_counters();
  for (auto& g : tensor_axes_) c += g->take_counters();
  for (size_t i = 0; i < groups_.size(); ++i) {
    // A dimension spanning the world shares the world's backend but has its own counters.
    c += groups_[i]->take_counters();
  }
  return c;
}

int64_t threads_for_worker(const WorkerEnv& env) {
  cpu_set_t set;
  CPU_ZERO(&set);
  int64_t affinity = 0;
  if (sched_getaffinity(0, sizeof set, &set) == 0) affinity = CPU_COUNT(&set);
  const int64_t node = std::max<int64_t>(1, static_cast<int64_t>(std::thread::hardware_concurrency()));
  return worker_threads(process_env(), affinity > 0 ? affinity : node, node, env.local_world);
}

void use_worker_threads(const WorkerEnv& env) {
  if (!std::getenv("OMP_NUM_THREADS")) at::set_num_threads(static_cast<int>(threads_for_worker(env)));
}

}  // namespace colossal::dist
