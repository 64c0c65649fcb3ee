// Gemini placement's pieces on their own: the recorded access order and the eviction it drives
// (furthest next use, checked against a brute-force scan of the repeating sequence and against the
// fewest re-gathers a cache can have), and the chunk store's residences (host or device) and their
// accounting.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <algorithm>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <set>

#include "src/memory/chunk_store.h"
#include "src/memory/chunk_trace.h"
#include "src/nn/module.h"

using colossal::memory::ChunkAccessTrace;

namespace {

// A step of L blocks, block b using chunks `of(b)`: forward 0..L-1, then backward L-1..0.
ChunkAccessTrace step_trace(int64_t blocks, const std::function<std::vector<int64_t>(int64_t)>& of, int64_t chunks) {
  ChunkAccessTrace t;
  for (int64_t b = 0; b < blocks; ++b) t.record(b, +1, of(b));
  for (int64_t b = blocks - 1; b >= 0; --b) t.record(b, -1, of(b));
  t.close(chunks);
  return t;
}

// The distance to c's next use after visit `now`, by walking the repeating sequence visit by visit.
int64_t walk_to_next_use(const ChunkAccessTrace& t, int64_t c, size_t now) {
  const size_t n = t.size();
  for (size_t k = 1; k <= n; ++k) {
    const auto& chunks = t.visit((now + k) % n).chunks;
    if (std::find(chunks.begin(), chunks.end(), c) != chunks.end()) return static_cast<int64_t>(k);
  }
  return ChunkAccessTrace::kNever;
}

// Re-gathers over `steps` repetitions of the trace with room for `capacity` chunks, evicting by `pick`
// (given the cached chunks the visit does not need and the visit index).
int64_t misses(const ChunkAccessTrace& t, size_t capacity, int steps,
               const std::function<int64_t(const std::vector<int64_t>&, size_t, const std::map<int64_t, int64_t>&)>& pick) {
  std::set<int64_t> cached;
  std::map<int64_t, int64_t> last_used;
  int64_t count = 0, clock = 0;
  for (int s = 0; s < steps; ++s)
    for (size_t v = 0; v < t.size(); ++v) {
      const auto& need = t.visit(v).chunks;
      for (int64_t c : need) {
        if (!cached.count(c)) {
          ++count;
          while (cached.size() >= capacity) {
            std::vector<int64_t> candidates;
            for (int64_t x : cached)
              if (std::find(need.begin(), need.end(), x) == need.end()) candidates.push_back(x);
            cached.erase(pick(candidates, v, last_used));
          }
          cached.insert(c);
        }
        last_used[c] = ++clock;
      }
    }
  return count;
}

}  // namespace

TEST(ChunkAccessTrace, EvictsTheChunkUsedFurthestAheadWhereTheStepRepeats) {
  // Four blocks, one chunk each (chunk b for block b), and chunk 4 that no block uses.
  const auto t = step_trace(4, [](int64_t b) { return std::vector<int64_t>{b}; }, 5);
  ASSERT_EQ(t.size(), 8u);
  // At block 3's forward (visit 3): chunk 2 is next used at block 2's backward (visit 5), chunk 1 at
  // visit 6, chunk 0 at visit 7: evict 0 first, and the unused chunk before any of them.
  EXPECT_EQ(t.eviction_order({2, 0, 4, 1}, 3), (std::vector<int64_t>{4, 0, 1, 2}));
  // At block 1's backward (visit 6): chunks 3 and 2 are next used in the next step's forward, chunk 3
  // later (visit 3 + 8) than chunk 2 (visit 2 + 8).
  EXPECT_EQ(t.eviction_order({2, 3}, 6), (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(t.distance_to_next_use(3, 6), 5);
  EXPECT_EQ(t.distance_to_next_use(4, 6), ChunkAccessTrace::kNever);
  // An evaluation's forward lands on the step's forward visits; a block never visited is not found.
  EXPECT_EQ(t.find(2, +1, 6), 2u);
  EXPECT_EQ(t.find(2, -1, 6), 5u);
  EXPECT_FALSE(t.find(9, +1, 0).has_value());
}

TEST(ChunkAccessTrace, TheOrderIsTheFurthestNextUseOnRandomTracesAndNoCacheRegathersLess) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 40; ++trial) {
    const int64_t blocks = 2 + static_cast<int64_t>(rng() % 6), chunks = blocks + 3;
    std::vector<std::vector<int64_t>> uses(static_cast<size_t>(blocks));
    for (auto& u : uses) {   // one to three chunks each, blocks sharing some (a chunk spanning two blocks)
      const size_t k = 1 + rng() % 3;
      while (u.size() < k) {
        const int64_t c = static_cast<int64_t>(rng() % static_cast<uint32_t>(chunks));
        if (std::find(u.begin(), u.end(), c) == u.end()) u.push_back(c);
      }
    }
    const auto t = step_trace(blocks, [&](int64_t b) { return uses[static_cast<size_t>(b)]; }, chunks);
    for (size_t now = 0; now < t.size(); ++now) {
      std::vector<int64_t> all(static_cast<size_t>(chunks));
      for (int64_t c = 0; c < chunks; ++c) all[static_cast<size_t>(c)] = c;
      const auto order = t.eviction_order(all, now);
      for (size_t i = 0; i + 1 < order.size(); ++i)
        EXPECT_GE(walk_to_next_use(t, order[i], now), walk_to_next_use(t, order[i + 1], now)) << "trial " << trial << " visit " << now;
    }
    // The same chunks through a cache of three, over five steps: furthest-next-use (Belady's rule) never
    // re-gathers more than least-recently-used, or than evicting at random.
    const auto furthest = [&](const std::vector<int64_t>& c, size_t v, const std::map<int64_t, int64_t>&) { return t.eviction_order(c, v).front(); };
    const auto lru = [](const std::vector<int64_t>& c, size_t, const std::map<int64_t, int64_t>& used) {
      return *std::min_element(c.begin(), c.end(), [&](int64_t a, int64_t b) { return used.at(a) < used.at(b); });
    };
    std::mt19937 pick_rng(trial);
    const auto random = [&](const std::vector<int64_t>& c, size_t, const std::map<int64_t, int64_t>&) { return c[pick_rng() % c.size()]; };
    const int64_t best = misses(t, 3, 5, furthest);
    EXPECT_LE(best, misses(t, 3, 5, lru)) << "trial " << trial;
    EXPECT_LE(best, misses(t, 3, 5, random)) << "trial " << trial;
  }
}

namespace {

// A module of three parameters (chunked as one), as the store sees a model without blocks.
struct ThreeTensors : colossal::nn::Module {
  ThreeTensors() {
    register_parameter("a", at::randn({64, 8}));
    register_parameter("b", at::randn({100}));
    register_parameter("c", at::randn({8, 8}));
  }
};

}  // namespace

TEST(ChunkAccessTrace, TheAutoPlanMovesTheChunksWhoseDataCrossesTheBusMostPerByteFirst) {
  // Blocks 0 and 1 share chunk 1 (four gathers a step) and have chunks 2 and 3 of their own, block 2 has
  // chunk 4 (half the size); chunk 0 is held whole (no gathers), chunk 5 has nothing on the host.
  const auto t = step_trace(3, [](int64_t b) { return b < 2 ? std::vector<int64_t>{1, 2 + b} : std::vector<int64_t>{4}; }, 6);
  const std::vector<int64_t> gathers{0, 4, 2, 2, 2, 0};
  for (int64_t c = 0; c < 6; ++c) EXPECT_EQ(t.gathers_per_step(c), gathers[static_cast<size_t>(c)]) << "chunk " << c;
  // As the plan counts them: parameters P cross at every gather, the optimizer side (3P on the host)
  // takes the gradient out and the shard back (2P) once a step.
  std::vector<int64_t> saved, moved;
  for (int64_t c = 0; c < 6; ++c) {
    const int64_t p = c == 4 ? 500 : 1000, host = c == 5 ? 0 : 4 * p;
    moved.push_back(host);
    saved.push_back(host == 0 ? 0 : t.gathers_per_step(c) * p + 2 * p);
  }
  // Per byte: chunk 1 1.5; chunks 2, 3 and 4 1.0 (ties by index); chunk 0 0.5; chunk 5 nothing to move.
  EXPECT_EQ(colossal::memory::placement_order(saved, moved), (std::vector<int64_t>{1, 2, 3, 4, 0, 5}));
}

TEST(ChunkStoreResidence, HostResidentDataIsCountedAsHostAndMovesWithoutChangingAValue) {
  using colossal::memory::ChunkStore;
  using colossal::memory::Residence;
  at::manual_seed(3);
  ThreeTensors m;
  const at::Tensor a = m.named_parameters()["a"].detach().clone();
  ChunkStore store(m, 0, 256, 1, 0, std::nullopt, {}, std::nullopt, std::nullopt, {Residence::device, Residence::host});
  auto& states = store.state("exp_avg");
  states[0].fill_(2);
  // Stage 0 in fp32: the parameters and whole gradients on the device, the optimizer side (the
  // states; the master is the parameters themselves) in host memory.
  const auto b = store.bytes();
  const int64_t padded = store.layout().total_numel() * 4;
  EXPECT_EQ(b.params, padded);
  EXPECT_EQ(b.grads, padded);
  EXPECT_EQ(b.optimizer, padded);
  EXPECT_EQ(b.host, padded);   // the state
  EXPECT_EQ(b.device(), 2 * padded);
  for (int64_t c = 0; c < store.layout().chunks(); ++c) store.set_homes(c, {Residence::device, Residence::device});
  EXPECT_EQ(store.bytes().host, 0);
  EXPECT_TRUE(at::equal(m.named_parameters()["a"].detach(), a));
  EXPECT_TRUE(at::equal(store.state("exp_avg")[0], at::full_like(store.state("exp_avg")[0], 2)));
}
