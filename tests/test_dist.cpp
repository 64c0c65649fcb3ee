// Distributed runtime, in one process: each rank is a thread with its own rendezvous client, Gloo
// process group and model, on 127.0.0.1 with a free port. Mesh arithmetic, the group wrapper's
// collectives, counters and errors, rendezvous failures, and ZeRO stages 0-2 against one process on
// the global batch and against each other.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/cuda.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <thread>

#include "src/core/error.h"
#include "src/core/recipe.h"
#include "src/dist/mesh.h"
#include "src/dist/launcher.h"
#include "src/dist/runtime.h"
#include "src/engine/train_plan.h"
#include "models/registry.h"
#include "src/nn/kernel_choice.h"
#include "src/memory/zero_strategy.h"
#include "src/nn/block_hooks.h"
#include "src/optim/factory.h"
#include "tests/support/test_support.h"

using namespace colossal;
using namespace colossal::dist;
using colossal::test::error_of;
using colossal::test::dp_mesh;
using colossal::test::env_for;
using colossal::test::run_ranks;

namespace {

Recipe recipe_with(const std::string& parallel) {
  return parse_recipe("[model]\nn_layer = 1\n[parallel]\n" + parallel, "r.toml");
}


}  // namespace

TEST(Mesh, TensorIsInnermostThenSequenceDataAndPipeline) {
  MeshShape s;
  s.size = {2, 2, 1, 2};   // pp, dp, sp, tp
  MeshLayout m(s);
  EXPECT_EQ(m.group_ranks(0, Dim::tp), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(m.group_ranks(5, Dim::tp), (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(m.group_ranks(1, Dim::dp), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(m.group_ranks(6, Dim::pp), (std::vector<int64_t>{2, 6}));
  EXPECT_EQ(m.group_ranks(3, Dim::sp), (std::vector<int64_t>{3}));
  EXPECT_EQ(m.coordinate(7, Dim::pp), 1);
  EXPECT_EQ(m.coordinate(6, Dim::dp), 1);
  EXPECT_EQ(m.coordinate(6, Dim::tp), 0);
  // Group indices number each dimension's groups 0..world/size-1 without gaps.
  for (Dim d : kDims) {
    std::set<int64_t> idx;
    for (int64_t r = 0; r < 8; ++r) {
      idx.insert(m.group_index(r, d));
      for (int64_t peer : m.group_ranks(r, d)) EXPECT_EQ(m.group_index(peer, d), m.group_index(r, d));
    }
    EXPECT_EQ(static_cast<int64_t>(idx.size()), 8 / s.of(d));
  }
}

TEST(Mesh, DataAutoTakesWhatTheOtherDimensionsLeave) {
  EXPECT_EQ(resolve_mesh(recipe_with("data = \"auto\"\n"), 4).of(Dim::dp), 4);
  EXPECT_EQ(resolve_mesh(recipe_with("tensor = 2\n"), 8).of(Dim::dp), 4);
  EXPECT_EQ(resolve_mesh(recipe_with("data = 2\ntensor = 2\n"), 4).describe(), "dp=2 pp=1 tp=2 sp=1");
}

TEST(Mesh, SizesWhoseProductIsNotTheWorldAreRejectedAtTheirKey) {
  EXPECT_NE(error_of([] { resolve_mesh(recipe_with("data = 3\n"), 4); }).find("r.toml:4: [parallel] data = 3"), std::string::npos)
      << error_of([] { resolve_mesh(recipe_with("data = 3\n"), 4); });
  EXPECT_NE(error_of([] { resolve_mesh(recipe_with("data = 3\n"), 4); }).find("set data = 4 or \"auto\""), std::string::npos);
  EXPECT_NE(error_of([] { resolve_mesh(recipe_with("tensor = 3\n"), 4); }).find("does not divide the world of 4"), std::string::npos);
  EXPECT_NE(error_of([] { recipe_with("data = \"all\"\n"); }).find("is not an integer or \"auto\""), std::string::npos);
  EXPECT_NE(error_of([] { recipe_with("data = 0\n"); }).find("out of range"), std::string::npos);
}

TEST(Group, AllReduceBroadcastAndBarrierAcrossFourRanksWithCounters) {
  auto errors = run_ranks(4, [](int64_t rank, Runtime& rt) {
    Group& g = rt.group(Dim::dp);
    at::Tensor t = at::full({1000}, static_cast<float>(rank + 1));
    g.all_reduce(t, Reduce::sum, "test");
    EXPECT_TRUE(at::all(t == 10.0f).item<bool>());
    at::Tensor m = at::full({3}, static_cast<double>(rank));
    g.all_reduce(m, Reduce::max, "test max");
    EXPECT_EQ(m[0].item<double>(), 3.0);
    at::Tensor b = at::full({5}, rank == 2 ? 7.0f : 0.0f);
    g.broadcast(b, 2, "test broadcast");
    EXPECT_TRUE(at::all(b == 7.0f).item<bool>());
    auto p = g.all_reduce_async(at::ones({8}), "async");
    g.wait(p);
    g.barrier("end");
    const CommCounters c = g.take_counters();
    EXPECT_EQ(c.calls, 5);
    EXPECT_EQ(c.bytes, 4000 + 12 + 20 + 32 + 4);   // at::full makes floats
    EXPECT_EQ(g.take_counters().calls, 0);   // taking resets
  });
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

TEST(Group, AllGatherAndReduceScatterMoveShardsInRankOrderAcrossFourRanks) {
  auto errors = run_ranks(4, [](int64_t rank, Runtime& rt) {
    Group& g = rt.group(Dim::dp);
    // all-gather: rank r contributes [r*10, r*10+1, r*10+2]; everyone gets the four in rank order.
    at::Tensor shard = at::arange(3, at::kFloat) + static_cast<float>(rank * 10);
    at::Tensor whole = at::empty({12});
    g.all_gather(whole, shard, "test gather");
    for (int64_t r = 0; r < 4; ++r)
      EXPECT_TRUE(at::equal(whole.narrow(0, r * 3, 3), at::arange(3, at::kFloat) + static_cast<float>(r * 10))) << r;
    // reduce-scatter: rank r contributes (r+1) * [0..11]; rank r keeps the sum (10 x) of its own three.
    at::Tensor in = at::arange(12, at::kDouble) * static_cast<double>(rank + 1);
    at::Tensor mine = at::empty({3}, at::kDouble);
    Pending p = g.reduce_scatter_async(mine, in, "test scatter");
    g.wait(p);
    EXPECT_TRUE(at::equal(mine, at::arange(rank * 3, rank * 3 + 3, at::kDouble) * 10.0)) << mine;
    const CommCounters c = g.take_counters();
    EXPECT_EQ(c.calls, 2);
    EXPECT_EQ(c.bytes, 12 + 96);   // the shard sent, the whole reduced
    // Sizes that are not ranks x shard are refused, naming the operation and the purpose.
    const std::string e = test::error_of([&] { g.all_gather(at::empty({10}), shard, "bad gather"); });
    EXPECT_NE(e.find("all_gather on group dp (bad gather): 10 Float values on cpu for 4 shards of 3 Float"), std::string::npos) << e;
    // A shard overlapping the whole is refused for a reduce-scatter; an all-gather may be in place (the
    // shard this rank's part of the whole), as ZeRO republishes updated chunks.
    at::Tensor buffer = at::arange(12, at::kFloat);
    const std::string overlap = test::error_of([&] { g.reduce_scatter(buffer.narrow(0, 0, 3), buffer, "overlap"); });
    EXPECT_NE(overlap.find("reduce_scatter on group dp (overlap)"), std::string::npos) << overlap;
    at::Tensor in_place = at::full({12}, -1.0f);
    in_place.narrow(0, rank * 3, 3).fill_(static_cast<float>(rank));
    g.all_gather(in_place, in_place.narrow(0, rank * 3, 3), "in place");
    for (int64_t r = 0; r < 4; ++r) EXPECT_TRUE(at::equal(in_place.narrow(0, r * 3, 3), at::full({3}, static_cast<float>(r)))) << r;
    // Several in flight at once, waited for in another order than launched, twice (the second round
    // reuses the first's receive buffers): each lands where it belongs.
    for (int round = 0; round < 2; ++round) {
      std::vector<at::Tensor> shards, wholes;
      std::vector<Pending> pending;
      for (int k = 0; k < 3; ++k) {
        wholes.push_back(at::full({8}, static_cast<float>((k + 1) * (rank + 1) + round)));
        shards.push_back(at::empty({2}));
        pending.push_back(g.reduce_scatter_async(shards.back(), wholes.back(), "in flight " + std::to_string(k)));
      }
      at::Tensor gathered = at::empty({8});
      at::Tensor own = at::full({2}, static_cast<float>(rank + round));
      Pending gp = g.all_gather_async(gathered, own, "in flight gather");
      g.wait(gp);
      for (int k = 2; k >= 0; --k) {
        g.wait(pending[static_cast<size_t>(k)]);
        EXPECT_TRUE(at::equal(shards[static_cast<size_t>(k)], at::full({2}, static_cast<float>((k + 1) * 10 + 4 * round)))) << k;
      }
      for (int64_t r = 0; r < 4; ++r) EXPECT_TRUE(at::equal(gathered.narrow(0, r * 2, 2), at::full({2}, static_cast<float>(r + round))));
    }
    // Gather to one rank: rank 2 receives every shard; the others only send (no whole of their own).
    at::Tensor to_two = rank == 2 ? at::full({8}, -1.0f) : at::Tensor();
    g.gather(to_two, at::full({2}, static_cast<float>(rank * 3)), 2, "to rank 2");
    if (rank == 2) {
      for (int64_t r = 0; r < 4; ++r) EXPECT_TRUE(at::equal(to_two.narrow(0, r * 2, 2), at::full({2}, static_cast<float>(r * 3)))) << r;
    }
    g.take_counters();
  });
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  // A group without a backend copies: the gathered whole is the shard, the scattered shard the whole.
  Group alone("dp");
  at::Tensor whole = at::empty({4});
  alone.all_gather(whole, at::ones({4}), "one");
  EXPECT_TRUE(at::equal(whole, at::ones({4})));
  at::Tensor shard = at::empty({4});
  alone.reduce_scatter(shard, at::full({4}, 2.0f), "one");
  EXPECT_TRUE(at::equal(shard, at::full({4}, 2.0f)));
}

namespace {

// Three ranks with a 2 s timeout: all run `op(g, "warm-up")`, then rank 1 stops taking part, as a
// SIGSTOPped process would, while the others run `op(g, what)`. Returns each rank's error.
std::vector<std::string> with_rank_one_stopped(const std::function<void(Group&, const std::string&)>& op, const std::string& what) {
  return run_ranks(
      3,
      [&](int64_t rank, Runtime& rt) {
        Group& g = rt.group(Dim::dp);
        op(g, "warm-up");
        if (rank == 1) {
          std::this_thread::sleep_for(std::chrono::seconds(4));
          return;
        }
        try {
          op(g, what);
        } catch (...) {
          // Keep this rank's store and connections up while the other rank reports (rank 0 hosts the store).
          std::this_thread::sleep_for(std::chrono::milliseconds(1500));
          throw;
        }
      },
      /*timeout_s=*/2);
}

}  // namespace

TEST(Group, AHungRankIsNamedByTheRanksThatTimedOutWaitingForIt) {
  auto errors = with_rank_one_stopped(
      [](Group& g, const std::string& what) {
        at::Tensor t = at::ones({4});
        g.all_reduce(t, Reduce::sum, what);
      },
      "gradient bucket 0");
  for (int r : {0, 2}) {
    EXPECT_NE(errors[r].find("rank 1 (node "), std::string::npos) << errors[r];
    EXPECT_NE(errors[r].find("stopped responding during all_reduce on group dp (gradient bucket 0) after 2 s"), std::string::npos)
        << errors[r];
    EXPECT_NE(errors[r].find("seen from rank " + std::to_string(r)), std::string::npos) << errors[r];
  }
}

TEST(Group, ARankMissingFromAShardExchangeIsNamed) {
  // Gloo's shards move by point-to-point sends and receives: their timeouts reach the same error.
  auto errors = with_rank_one_stopped(
      [](Group& g, const std::string& what) { g.all_gather(at::empty({6}), at::ones({2}), what); }, "parameter chunk 7");
  for (int r : {0, 2}) {
    EXPECT_NE(errors[r].find("rank 1 (node "), std::string::npos) << errors[r];
    EXPECT_NE(errors[r].find("stopped responding during all_gather on group dp (parameter chunk 7) after 2 s"), std::string::npos)
        << errors[r];
  }
}

TEST(Rendezvous, ARankThatNeverJoinsIsNamedWithinTheTimeout) {
  const int port = free_local_port();
  const auto t0 = std::chrono::steady_clock::now();
  JoinOptions o;
  o.timeout_s = 1.5;
  const std::string e = error_of([&] { Runtime::join(env_for(0, 3, port), dp_mesh(3), o); });
  EXPECT_NE(e.find("ranks 1, 2 of 3 never joined within 1.5 s"), std::string::npos) << e;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
}

TEST(Rendezvous, ABusyPortIsRejectedWithItsNumber) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof a;
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  const int port = ntohs(a.sin_port);
  JoinOptions o;
  o.timeout_s = 2;
  const std::string e = error_of([&] { Runtime::join(env_for(0, 2, port), dp_mesh(2), o); });
  close(fd);
  EXPECT_NE(e.find("port " + std::to_string(port)), std::string::npos) << e;
  EXPECT_NE(e.find("already in use"), std::string::npos) << e;
}

TEST(Rendezvous, AnUnreachableMasterIsReportedWithinTheTimeout) {
  const int port = free_local_port();   // nobody listens there
  JoinOptions o;
  o.timeout_s = 2;
  const auto t0 = std::chrono::steady_clock::now();
  const std::string e = error_of([&] { Runtime::join(env_for(1, 2, port), dp_mesh(2), o); });
  EXPECT_NE(e.find("rank 1"), std::string::npos) << e;
  EXPECT_NE(e.find("cannot reach the master at 127.0.0.1:" + std::to_string(port)), std::string::npos) << e;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 15.0);
}

TEST(Rendezvous, OneProcessOpensNoSocketAndItsGroupsDoNothing) {
  auto rt = Runtime::join(WorkerEnv{}, MeshShape{}, JoinOptions{});
  at::Tensor t = at::ones({3});
  rt->group(Dim::dp).all_reduce(t);
  rt->world_group().barrier("x");
  EXPECT_TRUE(at::all(t == 1.0f).item<bool>());
  EXPECT_EQ(rt->take_counters().calls, 0);
  EXPECT_EQ(rt->backend_name(), "none");
}

// ---- ZeRO stages 0-2 against one process and against each other ---------------------------------

namespace {

ModelConfig tiny_model() {
  ModelConfig m;
  m.n_layer = 4;   // enough blocks that a chunk left gathered far from the running block shows
  m.n_head = 2;
  m.n_embd = 32;   // multiples of 16: the dense layers write weight gradients straight into the buffer
  m.block_size = 16;
  m.vocab_size = 64;
  return m;
}

std::shared_ptr<nn::CausalLM> make_replica() {
  at::manual_seed(5);
  nn::LayerFactory f;
  auto model = nn::model_as<nn::CausalLM>(build_model(tiny_model(), f), "make_replica");
  model->train();
  return model;
}

// Runs `check(block)` before each block's backward, after the hooks before it in the chain.
struct BackwardProbe : nn::BlockHook {
  std::function<void(int64_t)> check;
  void before_backward(int64_t block) override { check(block); }
};

// AdamW unless another [optim] name is given (eps 1e-5 for AdamW and LAMB: see tests/test_dist_e2e.cpp).
// `offload_dir`: the optimizer states on NVMe in a file there.
std::unique_ptr<memory::ZeroStrategy> zero(nn::Module& m, Group& g, int stage, int64_t chunk_numel, const std::string& optimizer,
                                           const std::string& offload_dir = "", bool offload_params = false,
                                           const memory::PlacementOptions& placement = {},
                                           memory::OverlapUpdate overlap = memory::OverlapUpdate::off) {
  OptimConfig c;
  c.name = optimizer;
  c.betas = {0.9, 0.95};
  c.eps = 1e-5;
  c.trust_coefficient = 0.02;
  memory::ZeroOptions o{stage, chunk_numel, 0.1};
  o.offload_dir = offload_dir;
  o.offload_slice = 300;   // AdamW's update reaches each chunk in several slices
  o.offload_params = offload_params;
  o.placement = placement;
  o.overlap_update = overlap;
  return std::make_unique<memory::ZeroStrategy>(m, o, g, optim::make_optimizer(c));
}

// The global batch of step `step`: [8, 17] tokens, fixed.
at::Tensor global_batch(int64_t step) {
  at::manual_seed(11 + static_cast<uint64_t>(step));
  return at::randint(0, 64, {8, 17}, at::kLong);
}

double max_relative(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).norm().item<double>() / std::max(b.norm().item<double>(), 1e-30);
}

using Weights = std::map<std::string, at::Tensor>;

// `steps` optimizer steps at ZeRO `stage` over `world` ranks, each taking its rows of every micro-batch
// (rank r of W: rows [r*B, (r+1)*B) of the micro-batch, as the loader deals them), with clipping that
// acts. Returns every rank's final parameters; checks the per-step collective counts and the bytes held.
// `placement` (ZeRO-3): where chunks live and the device budget; with a budget each rank counts its
// thread's allocations, and `device` receives each rank's largest window and evictions. `overlap`: the
// steps go through optimizer_step (the training loop's call), its update beside the next forward or not.
struct DeviceFigures {
  int64_t peak = 0, evictions = 0;
  size_t visits = 0;   // in the recorded step
};
std::vector<Weights> train_ranks(int stage, int64_t world, int64_t micro, int64_t steps, int64_t chunk_numel,
                                 const std::string& optimizer = "adamw", const std::string& offload_dir = "", bool offload_params = false,
                                 const memory::PlacementOptions& placement = {}, std::vector<DeviceFigures>* device = nullptr,
                                 std::optional<memory::OverlapUpdate> overlap = std::nullopt) {
  const bool caching = placement.mode == memory::PlacementMode::automatic;   // gathered chunks may stay
  nn::set_kernel_policy({nn::KernelPath::Ours, nn::KernelPath::Ours, nn::KernelPath::Ours, nn::KernelPath::Ours,
                         nn::KernelPath::Ours});
  std::vector<std::shared_ptr<nn::CausalLM>> replicas;
  for (int64_t r = 0; r < world; ++r) replicas.push_back(make_replica());
  std::vector<at::Tensor> batches;   // drawn here: the generator is global, the ranks are threads
  for (int64_t step = 0; step < steps; ++step) batches.push_back(global_batch(step));
  std::vector<Weights> got(static_cast<size_t>(world));
  if (device) device->assign(static_cast<size_t>(world), {});
  auto body = [&](int64_t rank, Group& g) {
    auto& model = *replicas[static_cast<size_t>(rank)];
    memory::PlacementOptions mine = placement;   // a budget on a CPU is held against this thread's allocations
    if (mine.device_limit > 0) mine.counter = std::make_shared<memory::AllocationCounter>();
    auto zs = zero(model, g, stage, chunk_numel, optimizer, offload_dir, offload_params, mine, overlap.value_or(memory::OverlapUpdate::off));
    if (overlap) {
      EXPECT_EQ(zs->overlaps_update(), *overlap == memory::OverlapUpdate::on);
    }
    const int64_t chunks = zs->store().layout().chunks();
    if (auto hook = zs->block_hook()) {   // ZeRO-3 gathers and releases around each block
      auto chain = std::make_shared<nn::BlockHooks>();
      chain->add(hook);
      // ZeRO-3 holds in backward only the chunks of the running block, of the one before it (being
      // prefetched) and of the one after it (its gradients still being reduced), never the model.
      // From stage 2 the block's gradients are summed into their chunk's buffer where they are
      // computed: its parameters' .grad are the buffer's views before the block's backward runs.
      auto probe = std::make_shared<BackwardProbe>();
      probe->check = [&zs, chunks, rank, stage](int64_t block) {
        const auto& store = zs->store();
        for (size_t i = 0; i < store.layout().slots.size(); ++i) {
          if (store.block_of_slot(static_cast<int64_t>(i)) != block) continue;
          EXPECT_TRUE(store.param_of(static_cast<int64_t>(i)).grad().defined())
              << "rank " << rank << ": slot " << i << " has no gradient buffer at block " << block << "'s backward";
        }
        if (stage < 3) return;
        for (int64_t c = 0; c < chunks; ++c) {
          if (!store.releasable(c) || !store.present(c)) continue;
          bool near = false;
          for (size_t i = 0; i < store.layout().slots.size(); ++i)
            near |= store.layout().slots[i].chunk == c && std::abs(store.block_of_slot(static_cast<int64_t>(i)) - block) <= 1;
          EXPECT_TRUE(near) << "rank " << rank << ": chunk " << c << " still gathered at block " << block << "'s backward";
        }
      };
      if (stage >= 2 && !caching) chain->add(probe);
      model.set_block_hooks(chain);
    }
    for (int64_t step = 0; step < steps; ++step) {
      const auto& batch = batches[static_cast<size_t>(step)];
      const int64_t rows = 8 / micro / world;
      for (int64_t m = 0; m < micro; ++m) {
        zs->before_forward();   // the embeddings' chunk: its all-gather after the last update may still run
        zs->before_backward(m == micro - 1);
        auto b = batch.narrow(0, m * 8 / micro + rank * rows, rows);
        at::Tensor loss = model.loss(b.narrow(1, 0, 16), b.narrow(1, 1, 16)) / static_cast<double>(micro);
        if (stage == 3 && !caching) {   // between forward and backward the blocks' chunks are released: backward gathers them again
          int64_t released = 0;
          for (int64_t c = 0; c < chunks; ++c) released += zs->store().releasable(c) && !zs->store().present(c);
          EXPECT_GT(released, 0) << "micro-batch " << m;
        }
        loss.backward();
        zs->after_backward();
        if (world > 1 && stage < 3) {   // a chunk's reduction per micro-batch at stage 2, once a step below it
          EXPECT_EQ(g.take_counters().calls, stage == 2 || m == micro - 1 ? chunks : 0) << "stage " << stage << " micro " << m;
        }
      }
      if (overlap) {
        const auto report = zs->optimizer_step(1e-2, 0.05);
        EXPECT_GT(report.grad_norm, 0.05);   // clipping acts
        EXPECT_EQ(report.overlapped, zs->overlaps_update());
      } else {
        EXPECT_GT(zs->clip_grad_norm(0.05), 0.05);   // clipping acts
        zs->step(1e-2);
        zs->zero_grad();
      }
      g.take_counters();
    }
    // The bytes each rank holds are the ZeRO formulas over the chunked elements (padding included).
    const auto& store = zs->store();
    const int64_t P = store.layout().total_numel() * 4, W = stage == 0 ? 1 : world;
    const int64_t states = static_cast<int64_t>(zs->optimizer().state_names().size());
    const memory::ChunkBytes b = store.bytes();
    // ZeRO-3 keeps a shard of each chunk of block tensors (every block chunk is released between steps)
    // and the chunks of the embeddings, final norm and head whole.
    int64_t params = 0, released = 0;
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t bytes = store.layout().chunk_sizes[static_cast<size_t>(c)] * 4;
      params += store.releasable(c) ? (offload_params ? 0 : bytes / W) : bytes;   // on NVMe: nothing between uses
      released += store.releasable(c) && !store.present(c);
      if (stage < 3) {
        EXPECT_FALSE(store.releasable(c));
      }
    }
    if (device) (*device)[static_cast<size_t>(rank)] = {zs->device_peak(), zs->evictions(), zs->access_trace().size()};
    if (caching) {   // the rest counts what ZeRO-3 holds with every block chunk released
      zs->gather_all();
      for (auto& item : model.named_parameters()) got[static_cast<size_t>(rank)][item.key()] = item.value().detach().clone();
      return;
    }
    if (stage == 3) {
      EXPECT_GT(released, 0);
    }
    if (stage == 3 && W > 1) {
      EXPECT_LT(params, P);
    }
    for (int64_t c = 0; c < chunks; ++c) EXPECT_EQ(store.present(c), !store.releasable(c)) << "chunk " << c;
    EXPECT_EQ(b.params, params);
    EXPECT_EQ(b.grads, stage <= 1 ? P : P / W);
    if (offload_dir.empty()) {
      EXPECT_EQ(b.optimizer, states * P / W);
    } else {   // in the file, with three chunks' states staged in memory
      EXPECT_GE(b.nvme, (states + (offload_params ? 1 : 0)) * P / W);   // the master, which the parameters are read from
      EXPECT_LT(b.optimizer, states * P / W);
    }
    zs->gather_all();   // ZeRO-3's block chunks are released between steps
    for (auto& item : model.named_parameters()) got[static_cast<size_t>(rank)][item.key()] = item.value().detach().clone();
    zs->settle_chunks();
  };
  if (world == 1) {
    Group alone("dp");
    body(0, alone);
    return got;
  }
  auto errors = run_ranks(world, [&](int64_t rank, Runtime& rt) { body(rank, rt.group(Dim::dp)); });
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  return got;
}

void expect_same(const std::vector<Weights>& got, const Weights& expected, double tolerance, const std::string& what) {
  for (size_t r = 0; r < got.size(); ++r)
    for (const auto& [name, t] : expected) {
      ASSERT_TRUE(got[r].count(name)) << what << ": " << name;
      EXPECT_LT(max_relative(got[r].at(name), t), tolerance) << what << ", rank " << r << ", " << name;
      EXPECT_TRUE(at::equal(got[r].at(name), got[0].at(name))) << what << ": ranks disagree bitwise on " << name;
    }
}

// Every rank's weights equal `want`'s bit for bit.
void expect_identical(const std::vector<Weights>& got, const std::vector<Weights>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t r = 0; r < got.size(); ++r)
    for (const auto& [name, t] : want[r]) EXPECT_TRUE(at::equal(got[r].at(name), t)) << what << ", rank " << r << ", " << name;
}

}  // namespace

TEST(Zero, PlainDataParallelAtTwoAndFourRanksEqualsOneProcessOnTheGlobalBatch) {
  const auto one = train_ranks(0, 1, 1, 3, 4096)[0];
  expect_same(train_ranks(0, 2, 1, 3, 4096), one, 1e-5, "2 ranks");
  expect_same(train_ranks(0, 4, 1, 3, 1024), one, 1e-5, "4 ranks, small chunks");
}

TEST(Zero, StagesOneTwoAndThreeEqualPlainDataParallelWithAccumulationAndClipping) {
  // Chunks of 1000 elements: tensors straddle the shard boundaries (and chunks) at both sizes. Under
  // ZeRO-3 each block's chunks are gathered for its forward, released, gathered again for its backward
  // (autograd's saved views of the weights see the gathered values) and released once reduced.
  for (int64_t world : {2, 4}) {
    const auto plain = train_ranks(0, world, 2, 3, 1000)[0];
    for (int stage : {1, 2, 3})
      expect_same(train_ranks(stage, world, 2, 3, 1000), plain, 1e-6, "stage " + std::to_string(stage) + " at " + std::to_string(world));
    // Chunks about a block long, so chunks span blocks and a block's backward launches one reduction:
    // the probe in train_ranks checks that each is released one block later, not after the window.
    if (world == 2) expect_same(train_ranks(3, world, 2, 3, 12000), plain, 1e-6, "stage 3, block-sized chunks");
  }
}

TEST(Zero, LayerWiseOptimizersSumTheirNormsOverTheShardsOfASplitTensor) {
  // Chunks of 1000 elements cut in two: the 3072-element attention matrices straddle shard boundaries,
  // so LAMB's and LARS's trust ratios are wrong unless each norm is summed over both ranks.
  for (const char* name : {"lamb", "lars", "lion", "sgd"}) {
    const auto plain = train_ranks(0, 2, 1, 3, 1000, name)[0];
    expect_same(train_ranks(2, 2, 1, 3, 1000, name), plain, 1e-6, std::string(name) + " at stage 2");
    expect_same(train_ranks(3, 2, 1, 3, 1000, name), plain, 1e-6, std::string(name) + " at stage 3");
  }
}

TEST(Zero, AtOneRankEveryStageIsTheSameUpdate) {
  const auto plain = train_ranks(0, 1, 2, 3, 1000)[0];
  for (int stage : {1, 2, 3}) expect_same(train_ranks(stage, 1, 2, 3, 1000), plain, 1e-6, "stage " + std::to_string(stage));
}

TEST(ZeroOffload, OptimizerStatesOnNvmeGiveTheSameWeightsBitForBit) {
  // Chunks of 1000 elements in slices of 300: dozens of chunks through three staging buffers, so every
  // step reads, evicts and writes back, and AdamW's tensors reach it in pieces (LAMB's whole, a chunk at
  // a time); the arithmetic is the in-memory update's, so the weights are identical.
  colossal::test::TempDir dir;
  expect_identical(train_ranks(0, 1, 2, 3, 1000, "adamw", dir.path()), train_ranks(0, 1, 2, 3, 1000), "one rank");
  const auto zero3_one = train_ranks(3, 1, 2, 3, 1000), zero3_two = train_ranks(3, 2, 2, 3, 1000);
  expect_identical(train_ranks(3, 2, 2, 3, 1000, "adamw", dir.path()), zero3_two, "ZeRO-3 at two ranks");
  // Parameters on NVMe too: each block's chunks are read from the master in the file as the block runs
  // (its next block's read started while it computes), at one rank straight into the chunk, at two
  // each rank's shard then all-gathered.
  expect_identical(train_ranks(3, 1, 2, 3, 1000, "adamw", dir.path(), true), zero3_one, "parameters on NVMe, one rank");
  expect_identical(train_ranks(3, 2, 2, 3, 1000, "adamw", dir.path(), true), zero3_two, "parameters on NVMe, ZeRO-3 at two ranks");
  // A layer-wise rule updated a chunk at a time still sums each tensor's norms over both ranks' shards.
  expect_identical(train_ranks(2, 2, 1, 3, 1000, "lamb", dir.path()), train_ranks(2, 2, 1, 3, 1000, "lamb"), "LAMB at stage 2");
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()), std::filesystem::directory_iterator()), 0);
}

TEST(GeminiPlacement, CpuAndAutoPlacementsAndAHostOptimizerGiveTheSameWeightsBitForBit) {
  // Block chunks of 1000 elements: every block spans several, and a chunk may span two blocks.
  using memory::PlacementMode;
  using memory::Residence;
  memory::PlacementOptions cpu, host_optimizer, host_params, automatic;
  cpu.mode = PlacementMode::cpu;
  cpu.homes = {Residence::host, Residence::host};
  host_optimizer.homes.states = Residence::host;   // offload_optimizer = "cpu", at any stage
  host_params.homes.params = Residence::host;      // offload_params = "cpu" alone (ZeRO-3)
  automatic.mode = PlacementMode::automatic;       // a budget the whole model fits: every chunk moves and stays
  automatic.homes = cpu.homes;
  automatic.device_limit = int64_t{1} << 30;
  for (int64_t world : {1, 2}) {
    const std::string at = " at " + std::to_string(world) + " rank(s)";
    const auto zero3 = train_ranks(3, world, 2, 3, 1000);
    expect_identical(train_ranks(3, world, 2, 3, 1000, "adamw", "", false, cpu), zero3, "placement cpu" + at);
    expect_identical(train_ranks(3, world, 2, 3, 1000, "adamw", "", false, host_params), zero3, "offload_params cpu" + at);
    std::vector<DeviceFigures> figures;
    expect_identical(train_ranks(3, world, 2, 3, 1000, "adamw", "", false, automatic, &figures), zero3, "placement auto" + at);
    for (const auto& f : figures) {
      EXPECT_EQ(f.visits, 2u * 4 * 2) << "two micro-batches of four blocks, forward and backward, recorded" << at;
      EXPECT_EQ(f.evictions, 0) << at;
      EXPECT_GT(f.peak, 0) << at;
    }
    expect_identical(train_ranks(2, world, 2, 3, 1000, "adamw", "", false, host_optimizer), train_ranks(2, world, 2, 3, 1000),
                     "offload_optimizer cpu at stage 2" + at);
  }
}

TEST(GeminiPlacement, ADeviceBudgetEvictsByFurthestNextUseAndIsNeverExceeded) {
  // Three runs of placement auto: a budget the model fits in (nothing evicted: the most the device ever
  // needs with every chunk kept), then one between that and the first step's peak (which gathers each
  // block's chunks only while it runs): chunks must be evicted, the weights are still ZeRO-3's, and no
  // window of any step exceeds the budget. A budget below the first step's peak ends the run, naming it.
  using memory::PlacementMode;
  memory::PlacementOptions automatic;
  automatic.mode = PlacementMode::automatic;
  automatic.homes = {memory::Residence::host, memory::Residence::host};
  automatic.device_limit = int64_t{1} << 30;
  for (int64_t world : {1, 2}) {
    const std::string at = " at " + std::to_string(world) + " rank(s)";
    // One micro-batch, small chunks: many chunks per block, so what caching keeps is visible.
    const auto zero3 = train_ranks(3, world, 1, 4, 500);
    std::vector<DeviceFigures> roomy, first_step, tight;
    train_ranks(3, world, 1, 4, 500, "adamw", "", false, automatic, &roomy);
    memory::PlacementOptions measured = automatic;   // a budget the first step only just fits: nothing is cached
    measured.mode = PlacementMode::cpu;
    train_ranks(3, world, 1, 4, 500, "adamw", "", false, measured, &first_step);
    ASSERT_LT(first_step[0].peak, roomy[0].peak) << "caching every chunk must need more than gathering one block's" << at;
    memory::PlacementOptions budget = automatic;
    budget.device_limit = (first_step[0].peak + roomy[0].peak) / 2 + first_step[0].peak / 16;   // past the plan's margin
    const auto got = train_ranks(3, world, 1, 4, 500, "adamw", "", false, budget, &tight);
    for (size_t r = 0; r < got.size(); ++r)
      for (const auto& [name, t] : zero3[r]) EXPECT_TRUE(at::equal(got[r].at(name), t)) << "rank " << r << ", " << name << at;
    for (const auto& f : tight) {
      EXPECT_GT(f.evictions, 0) << at;
      EXPECT_LE(f.peak, budget.device_limit) << at;
      EXPECT_GT(f.peak, first_step[0].peak) << "the spare budget went unused" << at;
    }
  }
  // Below the first step's need: the run ends at the first window over it, saying what it held.
  memory::PlacementOptions small = automatic;
  small.device_limit = 64 * 1024;
  const std::string error = colossal::test::error_of([&] {
    Group alone("dp");
    auto model = make_replica();
    small.counter = std::make_shared<memory::AllocationCounter>();
    auto zs = zero(*model, alone, 3, 500, "adamw", "", false, small);
    auto chain = std::make_shared<nn::BlockHooks>();
    chain->add(zs->block_hook());
    model->set_block_hooks(chain);
    const at::Tensor b = global_batch(0);
    zs->before_forward();
    zs->before_backward(true);
    model->loss(b.narrow(1, 0, 16), b.narrow(1, 1, 16)).backward();
  });
  EXPECT_NE(error.find("device_memory_limit_gb: block 0's forward in the first step held "), std::string::npos) << error;
  EXPECT_NE(error.find("over the budget of 64.00 KiB"), std::string::npos) << error;
}

TEST(GeminiOverlap, TheUpdateBesideTheNextForwardGivesTheSameWeightsBitForBit) {
  // The same steps through optimizer_step with each update in place and beside the next forward: every
  // chunk's arithmetic is the same, so the weights are identical, at one rank and under ZeRO-3 at two,
  // with the states in memory, in host memory (placement cpu, auto under a budget) and on NVMe.
  colossal::test::TempDir dir;
  using memory::OverlapUpdate;
  using memory::PlacementMode;
  using memory::Residence;
  memory::PlacementOptions device, cpu, automatic;
  cpu.mode = PlacementMode::cpu;
  cpu.homes = {Residence::host, Residence::host};
  automatic.mode = PlacementMode::automatic;
  automatic.homes = cpu.homes;
  automatic.device_limit = int64_t{1} << 30;
  auto both = [&](int64_t world, const std::string& optimizer, const std::string& nvme, const memory::PlacementOptions& placement,
                  const std::string& what) {
    expect_identical(train_ranks(3, world, 2, 3, 1000, optimizer, nvme, false, placement, nullptr, OverlapUpdate::on),
                     train_ranks(3, world, 2, 3, 1000, optimizer, nvme, false, placement, nullptr, OverlapUpdate::off),
                     what + " at " + std::to_string(world) + " rank(s)");
  };
  for (int64_t world : {1, 2}) {
    both(world, "adamw", "", device, "states in memory");
    both(world, "adamw", "", cpu, "placement cpu");
    both(world, "adamw", dir.path(), device, "states on NVMe");
  }
  both(1, "adamw", "", automatic, "placement auto under a budget");
  both(1, "lamb", "", device, "LAMB, a chunk's tensors whole in each update call");
  both(1, "lamb", dir.path(), device, "LAMB with states on NVMe");
}

namespace {

// AdamW that, in its first update of a chunk of the last block's tensors, waits (up to 20 s) for the next step's
// forward to reach block 0, and records whether it did: only an update running beside that forward
// can see it. Or it throws there instead.
class ProbingAdamW : public optim::Optimizer {
 public:
  explicit ProbingAdamW(std::unique_ptr<optim::Optimizer> inner) : inner_(std::move(inner)) {}
  std::string name() const override { return inner_->name(); }
  std::vector<std::string> state_names() const override { return inner_->state_names(); }
  bool elementwise() const override { return inner_->elementwise(); }
  bool folds_grad_scale() const override { return inner_->folds_grad_scale(); }
  void update(std::vector<optim::ParamPiece>& pieces, const optim::StepContext& ctx) override {
    inner_->set_steps(steps());
    // A chunk of the last block's tensors alone (the one holding the final norm too is read first)
    const bool last = !pieces.empty() && std::all_of(pieces.begin(), pieces.end(), [&](const optim::ParamPiece& p) {
      return last_block.count(p.tensor) > 0;
    });
    if (steps() == 1 && last && !probed) {
      probed = true;
      if (fail) throw Error("probe: the update of the last block failed");
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (forwards.load() < 2 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      saw_next_forward = forwards.load() >= 2;
    }
    inner_->update(pieces, ctx);
  }
  std::set<int64_t> last_block;   // its tensors' slots
  std::atomic<int> forwards{0};   // forwards that reached block 0
  std::atomic<bool> saw_next_forward{false};
  bool fail = false, probed = false;

 private:
  std::unique_ptr<optim::Optimizer> inner_;
};

struct CountsForwards : nn::BlockHook {
  std::atomic<int>* forwards = nullptr;
  void before_forward(int64_t block) override {
    if (block == 0) ++*forwards;
  }
};

// Two training steps of ZeRO-3 at one rank with each update beside the next forward, through the
// probe; what it saw, read before the strategy (which owns it) goes.
struct ProbeSaw {
  bool next_forward = false;
  int forwards = 0;
};
ProbeSaw two_overlapped_steps(bool fail) {
  auto model = make_replica();
  Group alone("dp");
  OptimConfig c;
  auto optimizer = std::make_unique<ProbingAdamW>(optim::make_optimizer(c));
  ProbingAdamW* probe = optimizer.get();
  probe->fail = fail;
  memory::ZeroOptions o{3, 1000, 0.1};
  o.overlap_update = memory::OverlapUpdate::on;
  memory::ZeroStrategy zs(*model, o, alone, std::move(optimizer));
  const int64_t last = static_cast<int64_t>(model->blocks().size()) - 1;
  for (int64_t i = 0; i < static_cast<int64_t>(zs.store().layout().slots.size()); ++i)
    if (zs.store().block_of_slot(i) == last) probe->last_block.insert(i);
  auto chain = std::make_shared<nn::BlockHooks>();
  chain->add(zs.block_hook());
  auto counter = std::make_shared<CountsForwards>();
  counter->forwards = &probe->forwards;
  chain->add(counter);
  model->set_block_hooks(chain);
  for (int64_t step = 0; step < 2; ++step) {
    const at::Tensor b = global_batch(step);
    zs.before_forward();
    zs.before_backward(true);
    model->loss(b.narrow(1, 0, 16), b.narrow(1, 1, 16)).backward();
    zs.after_backward();
    EXPECT_TRUE(zs.optimizer_step(1e-2, 0).overlapped);
  }
  zs.gather_all();
  return {probe->saw_next_forward.load(), probe->forwards.load()};
}

}  // namespace

TEST(GeminiOverlap, TheNextForwardRunsWhileTheLastBlocksUpdateIsStillGoing) {
  const ProbeSaw saw = two_overlapped_steps(false);
  EXPECT_TRUE(saw.next_forward) << "the first update's last block finished before the next forward began";
  EXPECT_EQ(saw.forwards, 2);
}

TEST(GeminiOverlap, AnUpdateThatFailsBesideTheForwardEndsThatForwardWithItsError) {
  try {
    two_overlapped_steps(true);
    ADD_FAILURE() << "the failed update went unnoticed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("probe: the update of the last block failed"), std::string::npos) << e.what();
  }
}

TEST(GeminiOverlap, AskedForWhereItCannotRunItIsRefusedAndAutoChoosesWhereItPays) {
  colossal::test::TempDir dir;
  Group alone("dp");
  auto with = [&](int stage, const std::string& nvme, bool params_on_nvme, memory::OverlapUpdate overlap) {
    auto model = make_replica();
    return zero(*model, alone, stage, 1000, "adamw", nvme, params_on_nvme, {}, overlap)->overlaps_update();
  };
  auto refused = [&](int stage, const std::string& nvme, bool params_on_nvme, const std::string& why) {
    try {
      with(stage, nvme, params_on_nvme, memory::OverlapUpdate::on);
      ADD_FAILURE() << "accepted: " << why;
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("overlap_update = \"on\""), std::string::npos) << m;
      EXPECT_NE(m.find(why), std::string::npos) << m;
    }
  };
  refused(2, "", false, "zero = 3");
  refused(3, dir.path(), true, "offload_params");
  // On a CPU with the states in memory the update and the forward would share its cores.
  EXPECT_FALSE(with(3, "", false, memory::OverlapUpdate::automatic));
  EXPECT_TRUE(with(3, dir.path(), false, memory::OverlapUpdate::automatic));   // the update waits on the disk
  EXPECT_FALSE(with(3, dir.path(), false, memory::OverlapUpdate::off));
  EXPECT_FALSE(with(2, dir.path(), false, memory::OverlapUpdate::automatic));
}

// ---- a backend named explicitly runs even in a world of one (how NCCL is checked on one GPU) --------

namespace {

void check_world_of_one(const std::string& backend, const c10::Device& device) {
  JoinOptions o;
  o.backend = backend;
  o.cuda = device.is_cuda();
  auto rt = Runtime::join(WorkerEnv{}, MeshShape{}, o);
  EXPECT_EQ(rt->backend_name(), backend);
  at::Tensor t = at::full({1000}, 3.0f, at::TensorOptions().device(device));
  rt->group(Dim::dp).all_reduce(t, Reduce::sum, "one");
  EXPECT_TRUE(at::all(t == 3.0f).item<bool>());
  auto p = rt->group(Dim::dp).all_reduce_async(t, "async");
  rt->group(Dim::dp).wait(p);
  at::Tensor host = at::tensor({2.5, 1.0}, at::kDouble);   // staged through the device for NCCL
  rt->world_group().all_reduce(host, Reduce::sum, "host scalars");
  EXPECT_EQ(host[0].item<double>(), 2.5);
  rt->world_group().barrier("end");
  const CommCounters c = rt->take_counters();
  EXPECT_GE(c.calls, 4);
  EXPECT_GE(c.bytes, 8000);
}

}  // namespace

TEST(WorldOfOne, AnExplicitGlooBackendRunsRealCollectives) { check_world_of_one("gloo", c10::kCPU); }

TEST(WorldOfOneOnGpu, AnExplicitNcclBackendRunsRealCollectives) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU visible: NCCL is checked on the GPU machine (scripts/dev/gpu_check.sh)";
  check_world_of_one("nccl", c10::Device(c10::kCUDA, 0));
}
