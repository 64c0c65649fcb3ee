// The chunk layout (packing in execution order, a tensor larger than a chunk alone, shard-aligned
// sizes), the chunk-size search's padding on the zoo's shapes (below 2%: equal chunks leave a tail where a
// block does not fit, e.g. after GPT-2's position table), the tensor-state transition table, and
// training's host heap policy.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <sys/resource.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include "models/bert/bert.h"
#include "models/gpt/gpt.h"
#include "models/registry.h"
#include "src/core/recipe.h"
#include "src/core/spare_buffers.h"
#include "src/memory/chunk_layout.h"
#include "src/memory/chunk_store.h"
#include "src/memory/host_heap.h"
#include "src/memory/tensor_state.h"
#include "src/nn/block.h"
#include "tests/support/test_support.h"

using namespace colossal;
using namespace colossal::memory;

namespace {

// A pre-norm transformer's parameters in registration order (what chunk_specs reads from a model):
// embeddings, then each block (norm, qkv, proj, norm, fc, proj), then the final norm.
std::vector<ChunkTensorSpec> transformer(int64_t vocab, int64_t positions, int64_t c, int64_t layers, int64_t extra_rows = 0) {
  std::vector<ChunkTensorSpec> s{{"wte", {vocab, c}, true}, {"wpe", {positions, c}, true}};
  if (extra_rows) s.push_back({"extra", {extra_rows, c}, true});   // BERT's token types, ViT's patch projection
  for (int64_t l = 0; l < layers; ++l) {
    const std::string b = "h." + std::to_string(l) + ".";
    for (auto [name, shape] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
             {"ln_1.weight", {c}}, {"ln_1.bias", {c}}, {"attn.c_attn.weight", {3 * c, c}}, {"attn.c_attn.bias", {3 * c}},
             {"attn.c_proj.weight", {c, c}}, {"attn.c_proj.bias", {c}}, {"ln_2.weight", {c}}, {"ln_2.bias", {c}},
             {"mlp.c_fc.weight", {4 * c, c}}, {"mlp.c_fc.bias", {4 * c}}, {"mlp.c_proj.weight", {c, 4 * c}}, {"mlp.c_proj.bias", {c}}})
      s.push_back({b + name, shape, shape.size() == 2});
  }
  s.push_back({"ln_f.weight", {c}, false});
  s.push_back({"ln_f.bias", {c}, false});
  return s;
}

int64_t elements(const std::vector<ChunkTensorSpec>& specs) {
  int64_t n = 0;
  for (const auto& t : specs) {
    int64_t e = 1;
    for (auto d : t.shape) e *= d;
    n += e;
  }
  return n;
}

}  // namespace

TEST(ChunkLayout, PacksInOrderAndGivesATensorLargerThanAChunkItsOwn) {
  const std::vector<ChunkTensorSpec> specs{{"a", {100}, false}, {"b", {10, 10}, true}, {"big", {50, 20}, true}, {"c", {30}, false}};
  const ChunkLayout l = plan_chunks(specs, 250, 2);
  // 250 rounds up to 256 (a multiple of 16 x 2 shards): a and b fit the first chunk, big (1000) gets
  // 1024 of its own, c opens a third.
  EXPECT_EQ(l.chunk_numel, 256);
  EXPECT_EQ(l.chunk_sizes, (std::vector<int64_t>{256, 1024, 32}));   // the last cut to what it holds
  EXPECT_EQ(l.slots[1].chunk, 0);
  EXPECT_EQ(l.slots[1].offset, 100);
  EXPECT_EQ(l.slots[2].chunk, 1);
  EXPECT_EQ(l.slots[2].offset, 0);
  EXPECT_EQ(l.slots[3].chunk, 2);
  EXPECT_EQ(l.slots[3].offset, 0);
  EXPECT_EQ(l.padding(), 256 + 1024 + 32 - 1230);
  EXPECT_EQ(l.shard_numel(1), 512);
  EXPECT_EQ(l.chunk_slots[0], (std::vector<int64_t>{0, 1}));
  EXPECT_TRUE(l.slots[1].decay);
  EXPECT_FALSE(l.slots[3].decay);
}

TEST(ChunkLayout, TheSearchKeepsPaddingSmallOnTheZoosShapes) {
  struct Model {
    const char* name;
    std::vector<ChunkTensorSpec> specs;
  };
  const std::vector<Model> zoo{{"gpt2-124m", transformer(50257, 1024, 768, 12)},
                               {"gpt2-350m", transformer(50257, 1024, 1024, 24)},
                               {"bert-base", transformer(30522, 512, 768, 12, 2)},
                               {"vit-b16", transformer(1000, 197, 768, 12, 768)},
                               {"opt-1.3b", transformer(50272, 2050, 2048, 24)}};
  for (const auto& m : zoo)
    for (int stage : {0, 3})
      for (int64_t shards : {1, 2, 4, 8}) {
        const int64_t chunk = choose_chunk_numel(m.specs, 0, shards, stage);
        const ChunkLayout l = plan_chunks(m.specs, chunk, shards);
        const double waste = static_cast<double>(l.padding()) / static_cast<double>(elements(m.specs));
        EXPECT_LT(waste, 0.02) << m.name << " at " << shards << " shards, stage " << stage << ": chunk " << chunk << ", " << l.chunks() << " chunks";
        EXPECT_GE(l.chunks(), stage == 3 ? 16 : 4) << m.name;   // fine enough to overlap communication (and, at 3, to bound memory)
        if (stage == 3) {
          EXPECT_LE(chunk, (elements(m.specs) / 32 + kAlign * shards)) << m.name;
        }
        for (auto size : l.chunk_sizes) EXPECT_EQ(size % (kAlign * shards), 0);
      }
  // An explicit size is MiB of fp32.
  EXPECT_EQ(choose_chunk_numel(transformer(100, 10, 16, 1), 2, 1), 2 * 1024 * 1024 / 4);
}

TEST(SpareBuffers, ReusesABufferOfTheSameSizeAndTypeKeepsAFewAndDropsViews) {
  SpareBuffers spares(2);
  at::Tensor a = spares.take(16, at::kFloat);
  const void* memory = a.data_ptr();
  spares.give(a);
  a = at::Tensor();
  EXPECT_EQ(spares.take(16, at::kDouble).numel(), 16);     // another dtype: a new buffer
  EXPECT_NE(spares.take(8, at::kFloat).data_ptr(), memory);   // another size: a new buffer
  at::Tensor again = spares.take(16, at::kFloat);
  EXPECT_EQ(again.data_ptr(), memory);                      // the same memory back
  EXPECT_EQ(spares.kept(), 0u);
  // At most two of a size are kept; a view (whose storage is larger than it) is never kept.
  for (int i = 0; i < 3; ++i) spares.give(at::empty({16}));
  EXPECT_EQ(spares.kept(), 2u);
  spares.give(at::empty({32}).narrow(0, 0, 16));
  spares.give(at::empty({4, 4}));
  EXPECT_EQ(spares.kept(), 2u);
  spares.clear();
  EXPECT_EQ(spares.kept(), 0u);
}

// Training's heap policy: a step's worth of 12 MB blocks (the size of GPT-2 124M's MLP activations at 1024
// tokens), freed together and taken again, come back from the heap rather than as new pages from the
// kernel. Under glibc's moving thresholds the freed top (96 MB) is past twice the largest block freed
// and is returned every round, so every round faults its pages in again; the first round here may fault
// (the heap grows), the later ones must not.
TEST(HostHeap, BlocksFreedTogetherComeBackWithoutPageFaults) {
  ASSERT_TRUE(keep_freed_host_memory());
  constexpr size_t kBlock = size_t{12} << 20;
  constexpr int kBlocks = 8;
  const long pages = static_cast<long>(kBlock * kBlocks) / sysconf(_SC_PAGESIZE);
  auto faults_of_one_round = [&] {
    rusage before{}, after{};
    getrusage(RUSAGE_SELF, &before);
    std::vector<char*> blocks;
    for (int i = 0; i < kBlocks; ++i) {
      char* p = static_cast<char*>(std::malloc(kBlock));
      if (p == nullptr) break;
      std::memset(p, i + 1, kBlock);
      asm volatile("" : : "r"(p) : "memory");   // the writes happen: a freed block's stores are otherwise dead
      blocks.push_back(p);
    }
    for (char* p : blocks) std::free(p);
    getrusage(RUSAGE_SELF, &after);
    return static_cast<int>(blocks.size()) == kBlocks ? after.ru_minflt - before.ru_minflt : -1L;
  };
  const long first = faults_of_one_round(), second = faults_of_one_round(), third = faults_of_one_round();
  ASSERT_GE(std::min({first, second, third}), 0) << "malloc refused a 12 MB block";
  EXPECT_LT(second, pages / 20) << "the first round took " << first << " faults, for " << pages << " pages";
  EXPECT_LT(third, pages / 20);
}

TEST(TensorState, EveryTransitionOutsideTheTableIsRejectedNamingTheTensorAndBothStates) {
  using S = TensorState;
  const std::set<std::pair<S, S>> legal{{S::free, S::hold},           {S::free, S::compute},
                                        {S::hold, S::compute},        {S::hold, S::free},
                                        {S::hold, S::ready_for_reduce}, {S::compute, S::hold},
                                        {S::compute, S::hold_after_bwd}, {S::compute, S::ready_for_reduce},
                                        {S::hold_after_bwd, S::compute}, {S::hold_after_bwd, S::ready_for_reduce},
                                        {S::ready_for_reduce, S::hold}, {S::ready_for_reduce, S::free}};
  for (int a = 0; a < kTensorStates; ++a)
    for (int b = 0; b < kTensorStates; ++b) {
      S from = static_cast<S>(a), to = static_cast<S>(b);
      S state = from;
      const std::string e = test::error_of([&] { transition(state, to, "h.0.attn.c_attn.weight"); });
      if (legal.count({from, to})) {
        EXPECT_EQ(e, "(no error)") << state_name(from) << " -> " << state_name(to);
        EXPECT_EQ(state, to);
      } else {
        EXPECT_NE(e.find("tensor \"h.0.attn.c_attn.weight\" cannot go from " + std::string(state_name(from)) + " to " + state_name(to)),
                  std::string::npos)
            << e;
        EXPECT_EQ(state, from);   // unchanged
      }
    }
}

namespace {

// A tiny GPT or BERT (BERT's rules zero the [PAD] row and the MLM bias after drawing them), its
// parameters allocated and initialised in place, or deferred.
std::shared_ptr<nn::Model> tiny_model(const std::string& family, nn::ParamStorage storage) {
  nn::LayerFactory f(storage);
  std::shared_ptr<nn::Model> m;
  if (family == "gpt") {
    gpt::GptConfig c;
    c.n_layer = 3, c.n_head = 2, c.n_embd = 16, c.block_size = 12, c.vocab_size = 50;
    m = std::make_shared<gpt::Gpt>(c, f);
  } else {
    bert::BertConfig c;
    c.n_layer = 3, c.n_head = 2, c.n_embd = 16, c.intermediate = 24, c.max_positions = 12, c.vocab_size = 50, c.pad_token_id = 3;
    m = bert::build(c, f);
  }
  if (storage == nn::ParamStorage::allocated) m->init_weights();
  return m;
}

}  // namespace

// What makes a ZeRO-3 run start from a plain run's weights without any rank building the model: a
// deferred model has no parameter memory, and its store, filled one initial value at a time
// (for_each_initial_value), holds on every rank, stage and precision exactly what a store built from
// the model initialised in place holds: full chunks, ZeRO-3 shards and fp32 master shards.
TEST(ChunkStore, ADeferredModelFilledTensorByTensorHoldsWhatTheInitialisedModelDoes) {
  for (const std::string family : {"gpt", "bert"})
    for (int stage = 0; stage <= 3; ++stage)
      for (const auto compute : {std::optional<at::ScalarType>{}, std::optional<at::ScalarType>{at::kBFloat16}})
        for (int64_t rank = 0; rank < 2; ++rank) {
          SCOPED_TRACE(family + " stage " + std::to_string(stage) + (compute ? " bf16" : " fp32") + " rank " + std::to_string(rank));
          at::manual_seed(11);
          auto built = tiny_model(family, nn::ParamStorage::allocated);
          ChunkStore want(*built, stage, 1024, 2, rank, compute, parameter_blocks(*built));

          auto shapes = tiny_model(family, nn::ParamStorage::deferred);
          for (const auto& p : shapes->parameters()) ASSERT_TRUE(nn::is_unallocated(p));
          ChunkStore got(*shapes, stage, 1024, 2, rank, compute, parameter_blocks(*shapes));
          at::manual_seed(11);
          int64_t written = 0;
          nn::for_each_initial_value(*shapes, [&](const std::string& name, const at::Tensor& v) {
            got.write(got.slot_of(name).value(), v);
            ++written;
          });
          EXPECT_EQ(written, static_cast<int64_t>(got.layout().slots.size()));
          ASSERT_EQ(got.layout().chunks(), want.layout().chunks());
          for (int64_t c = 0; c < got.layout().chunks(); ++c) {
            EXPECT_EQ(got.present(c), want.present(c));
            EXPECT_EQ(got.releasable(c), want.releasable(c));
            EXPECT_TRUE(at::equal(got.param_shard(c), want.param_shard(c))) << "chunk " << c;
            EXPECT_TRUE(at::equal(got.master_chunk(c), want.master_chunk(c))) << "chunk " << c;
            if (want.present(c)) {
              EXPECT_TRUE(at::equal(got.params()[static_cast<size_t>(c)], want.params()[static_cast<size_t>(c)]));
            }
          }
          if (stage == 3) {   // some block chunks are released: the model is never whole on this rank
            int64_t released = 0;
            for (int64_t c = 0; c < got.layout().chunks(); ++c) released += !got.present(c);
            EXPECT_GT(released, 0);
          }
          // The parameters are views of the chunks: a present one reads the initial value.
          const auto a = built->named_parameters(), b = shapes->named_parameters();
          for (size_t i = 0; i < a.size(); ++i)
            if (!nn::is_unallocated(b[i].value())) {
              EXPECT_TRUE(at::equal(a[i].value(), b[i].value())) << b[i].key();
            }
        }
}

// --dry-run's bytes per rank (models/registry.h) are what the chunk store holds for the same stage,
// precision and number of shards, applied to the chunked elements (padding included, as the log
// reports it), so the memory refusal and the plan use figures that come true. ZeRO-3 is left out: its
// formula counts every chunk as sharded, where the store keeps the embeddings', final norm's and head's
// chunks whole.
TEST(ChunkStore, TheDryRunsBytesPerRankAreWhatTheStoreHoldsAtEveryStageAndPrecision) {
  Recipe r;
  r.model.family = "gpt";
  r.model.n_layer = 4, r.model.n_head = 2, r.model.n_embd = 64, r.model.block_size = 32, r.model.vocab_size = 512;
  // offload_optimizer = "cpu": the states in host memory, where bf16 and fp16 keep compact gradient shards.
  for (const char* offload : {"none", "cpu"})
  for (const char* dtype : {"fp32", "bf16", "fp16"})
    for (int stage : {0, 1, 2})
      for (int64_t shards : {1, 4}) {
        r.precision.dtype = dtype;
        r.memory.zero = stage;
        r.memory.offload_optimizer = offload;
        nn::LayerFactory f;
        auto model = build_model(r.model, f);
        const auto compute = std::string(dtype) == "fp32" ? std::nullopt
                             : std::optional<at::ScalarType>(std::string(dtype) == "bf16" ? at::kBFloat16 : at::kHalf);
        const int64_t chunk = choose_chunk_numel(chunk_specs(*model), 0, shards, stage);   // "auto", as runs choose
        ChunkStore store(*model, stage, chunk, shards, 0, compute, parameter_blocks(*model), std::nullopt, std::nullopt, {},
                         compact_gradient_shards(r, std::string(offload) == "cpu"));
        store.pieces({"exp_avg", "exp_avg_sq"}, 0.1);   // AdamW's states, allocated as the strategy does
        const ChunkBytes held = store.bytes();
        const MemoryEstimate plan = estimate_training_memory(r, store.layout().total_numel(), stage == 0 ? 1 : shards);
        const std::string where = std::string(offload) + " " + dtype + " stage " + std::to_string(stage) + " over " + std::to_string(shards);
        EXPECT_EQ(plan.weights, static_cast<double>(held.params)) << where;
        EXPECT_EQ(plan.gradients, static_cast<double>(held.grads)) << where;
        EXPECT_EQ(plan.optimizer, static_cast<double>(held.optimizer)) << where;
      }
}
