// Serving's engine: paged attention against dense attention in double precision on every instruction set,
// continuous batching with the paged KV cache against one-at-a-time greedy generation for each decoder
// family (requests arriving at different steps, prompts in chunks, preemption forced by a small pool),
// cancellation freeing blocks at once, and the requests the engine refuses.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <cmath>

#include "kernels/cpu/decode_block.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/paged_attention.h"
#include "models/registry.h"
#include "src/core/error.h"
#include "src/engine/generation_checkpoint.h"
#include "src/engine/generator.h"
#include "src/engine/sampling.h"
#include "src/nn/cached_attention.h"
#include "src/nn/kernel_choice.h"
#include "src/nn/kv_storage.h"
#include "src/nn/paged_attention_aten.h"
#include "src/serve/batch_engine.h"
#include "src/serve/completion_api.h"
#include "src/serve/kv_blocks.h"
#include "src/serve/step_plan.h"
#include "support/test_support.h"

using namespace colossal;
using colossal::test::error_of;

TEST(PagedAttention, TokensOfSeveralSequencesInScatteredBlocksMatchDenseCausalAttentionOnEveryInstructionSet) {
  at::manual_seed(31);
  const int64_t h = 3, d = 40, bs = 4, blocks = 12;   // a head size with a vector tail on every set
  // Sequence A: positions 0..6 in blocks {5, 2}; B: positions 0..9 in {7, 0, 9}. The step computes A's
  // positions 5 and 6 (a chunk: 6 must see 5) and B's position 9; earlier positions are already cached.
  const std::vector<int32_t> table_a{5, 2}, table_b{7, 0, 9};
  struct Seq {
    const std::vector<int32_t>* table;
    int64_t length;
  };
  const Seq seqs[] = {{&table_a, 7}, {&table_b, 10}};
  auto keys = at::randn({2, 10, h, d}), values = at::randn({2, 10, h, d}), queries = at::randn({2, 10, h, d});
  for (bool alibi : {false, true}) {
    const auto slopes = at::tensor({0.5f, 0.25f, 0.125f});
    auto dense = [&](int64_t s, int64_t p) {   // sequence s's position p attending over [0, p], in double: [H, D]
      auto q = queries[s][p].to(at::kDouble), k = keys[s].narrow(0, 0, p + 1).to(at::kDouble),
           v = values[s].narrow(0, 0, p + 1).to(at::kDouble);                            // [p+1, H, D]
      auto scores = at::einsum("hd,jhd->hj", {q, k}) / std::sqrt(double(d));             // [H, p+1]
      if (alibi) scores += slopes.to(at::kDouble).view({h, 1}) * (at::arange(p + 1, at::kDouble) - p).view({1, p + 1});
      return at::einsum("hj,jhd->hd", {scores.softmax(-1), v});
    };
    for (auto isa : kernels::runnable_isas()) {
      kernels::ScopedIsa cap(isa);
      auto k_pool = at::zeros({blocks, h, bs, d}), v_pool = at::zeros({blocks, h, bs, d});
      std::vector<int64_t> positions;
      std::vector<const int32_t*> tables;
      std::vector<at::Tensor> qkv_rows;
      for (int64_t s = 0; s < 2; ++s)
        for (int64_t p = 0; p < seqs[s].length; ++p) {
          const bool in_step = (s == 0 && p >= 5) || (s == 1 && p == 9);
          const int64_t block = (*seqs[s].table)[p / bs], slot = p % bs;
          if (!in_step) {   // cached earlier
            k_pool.select(0, block).select(1, slot).copy_(keys[s][p]);
            v_pool.select(0, block).select(1, slot).copy_(values[s][p]);
            continue;
          }
          positions.push_back(p);
          tables.push_back(seqs[s].table->data());
          qkv_rows.push_back(at::stack({queries[s][p], keys[s][p], values[s][p]}));   // [3, H, D]
        }
      const auto qkv = at::stack(qkv_rows).contiguous();   // [3 tokens, 3, H, D]
      auto out = at::empty({3, h, d});
      const kernels::PagedAttentionDims dims{3, h, d, bs, static_cast<float>(1.0 / std::sqrt(double(d)))};
      kernels::paged_attention(qkv.const_data_ptr<float>(), k_pool.mutable_data_ptr<float>(), v_pool.mutable_data_ptr<float>(),
                               positions.data(), tables.data(), alibi ? slopes.const_data_ptr<float>() : nullptr,
                               out.mutable_data_ptr<float>(), dims);
      for (int64_t i = 0; i < 3; ++i) {
        const int64_t s = i < 2 ? 0 : 1, p = positions[static_cast<size_t>(i)];
        const auto ref = dense(s, p);
        EXPECT_LT((out[i].to(at::kDouble) - ref).abs().max().item<double>(), 1e-5)
            << kernels::isa_name(isa) << " token " << i << " alibi " << alibi;
      }
    }
    // ATen's path (any device or dtype: a GPU's serving), in float and in double from the same cached
    // keys: the same slots written, and the dense reference's outputs.
    for (auto dtype : {at::kFloat, at::kDouble}) {
      auto k_pool = at::zeros({blocks, h, bs, d}, dtype), v_pool = at::zeros({blocks, h, bs, d}, dtype);
      auto k_want = k_pool.clone(), v_want = v_pool.clone();
      std::vector<at::Tensor> qkv_rows;
      nn::PagedRows rows;
      rows.block_size = bs;
      for (int64_t s = 0; s < 2; ++s)
        for (int64_t p = 0; p < seqs[s].length; ++p) {
          const bool in_step = (s == 0 && p >= 5) || (s == 1 && p == 9);
          const int64_t block = (*seqs[s].table)[p / bs], slot = p % bs;
          k_want.select(0, block).select(1, slot).copy_(keys[s][p]);
          v_want.select(0, block).select(1, slot).copy_(values[s][p]);
          if (!in_step) {
            k_pool.select(0, block).select(1, slot).copy_(keys[s][p]);
            v_pool.select(0, block).select(1, slot).copy_(values[s][p]);
            continue;
          }
          rows.positions.push_back(p);
          rows.tables.push_back(seqs[s].table->data());
          qkv_rows.push_back(at::stack({queries[s][p], keys[s][p], values[s][p]}).to(dtype));
        }
      nn::LayerKv kv{k_pool, v_pool, &rows};
      const auto out = nn::aten_paged_attention(at::stack(qkv_rows).view({3, 1, 3 * h * d}), kv, h,
                                                alibi ? slopes : at::Tensor()).view({3, h, d});
      EXPECT_TRUE(at::equal(k_pool, k_want) && at::equal(v_pool, v_want)) << "the step's keys and values in their slots";
      for (int64_t i = 0; i < 3; ++i) {
        const int64_t s = i < 2 ? 0 : 1, p = rows.positions[static_cast<size_t>(i)];
        const auto ref = dense(s, p);
        EXPECT_LT((out[i].to(at::kDouble) - ref).abs().max().item<double>(), dtype == at::kDouble ? 1e-12 : 1e-5)
            << "ATen's path, " << dtype << ", token " << i << " alibi " << alibi;
      }
    }
  }
}

TEST(PagedAttention, AKeysScoreHasTheSameBitsWhateverBlockSizeHoldsIt) {
  // One sequence of 37 cached positions attended by its last token, in pools of block size 3, 8, 16 and 37:
  // keys fall in groups of eight or alone in a block's tail differently in each, and the outputs must not
  // move by a bit (a request's tokens must not depend on how the server cut its cache).
  at::manual_seed(33);
  const int64_t h = 2, d = 64, n = 37;
  const auto keys = at::randn({n, h, d}), values = at::randn({n, h, d}), query = at::randn({h, d});
  for (auto isa : kernels::runnable_isas()) {
    kernels::ScopedIsa cap(isa);
    at::Tensor first;
    for (int64_t bs : {3, 8, 16, 37}) {
      const int64_t blocks = (n + bs - 1) / bs;
      std::vector<int32_t> table(static_cast<size_t>(blocks));
      for (int64_t b = 0; b < blocks; ++b) table[static_cast<size_t>(b)] = static_cast<int32_t>(blocks - 1 - b);   // scattered
      auto k_pool = at::zeros({blocks, h, bs, d}), v_pool = at::zeros({blocks, h, bs, d});
      for (int64_t p = 0; p + 1 < n; ++p) {
        k_pool.select(0, table[static_cast<size_t>(p / bs)]).select(1, p % bs).copy_(keys[p]);
        v_pool.select(0, table[static_cast<size_t>(p / bs)]).select(1, p % bs).copy_(values[p]);
      }
      const auto qkv = at::stack({query, keys[n - 1], values[n - 1]}).unsqueeze(0).contiguous();   // [1, 3, H, D]
      auto out = at::empty({1, h, d});
      const int64_t position = n - 1;
      const int32_t* tables[] = {table.data()};
      const kernels::PagedAttentionDims dims{1, h, d, bs, 0.125f};
      kernels::paged_attention(qkv.const_data_ptr<float>(), k_pool.mutable_data_ptr<float>(), v_pool.mutable_data_ptr<float>(),
                               &position, tables, nullptr, out.mutable_data_ptr<float>(), dims);
      if (!first.defined()) first = out;
      EXPECT_TRUE(at::equal(out, first)) << kernels::isa_name(isa) << " block size " << bs << " differs by "
                                         << (out - first).abs().max().item<double>();
    }
  }
}

TEST(PagedAttention, OverANarrowPoolTheKernelGivesItsFp32CopysBitsAndAtensPathAgrees) {
  // A chunk of the last 3 tokens of a 29-position sequence in scattered blocks of 8, over an fp16, bf16 or
  // int8 pool and over an fp32 pool holding the values the narrow one reads back (kv_element.h): the
  // kernel widens as it loads, so the outputs agree bit for bit, and the narrow pool holds the bytes
  // ATen's path writes for the new keys and values; ATen's path over the narrow pool (a GPU's) agrees to
  // fp32's rounding.
  at::manual_seed(35);
  const int64_t h = 2, d = 24, n = 29, bs = 8, blocks = 4, chunk = 3;
  const auto scale = static_cast<float>(1.0 / std::sqrt(double(d)));   // ATen's path takes SDPA's
  const std::vector<int32_t> table = {2, 0, 3, 1};
  const auto queries = at::randn({n, h, d}), keys = at::randn({n, h, d}) * 3, values = at::randn({n, h, d});
  const auto slopes = at::tensor({0.5f, 0.25f});   // ALiBi slopes of the two heads
  for (const auto dtype : {at::kHalf, at::kBFloat16, at::kChar})
    for (auto isa : kernels::runnable_isas()) {
      kernels::ScopedIsa cap(isa);
      const auto read_back = [&](const at::Tensor& x) { return nn::from_kv_storage(nn::to_kv_storage(x, dtype), at::kFloat); };
      const int64_t w = nn::kv_row_width(d, dtype);
      for (const bool alibi : {false, true}) {
        auto narrow_k = at::zeros({blocks, h, bs, w}, dtype), narrow_v = at::zeros({blocks, h, bs, w}, dtype);
        auto wide_k = at::zeros({blocks, h, bs, d}), wide_v = at::zeros({blocks, h, bs, d});
        for (int64_t p = 0; p < n - chunk; ++p) {
          const int64_t block = table[static_cast<size_t>(p / bs)], slot = p % bs;
          nn::store_kv_rows(narrow_k.select(0, block).select(1, slot), keys[p]);
          nn::store_kv_rows(narrow_v.select(0, block).select(1, slot), values[p]);
          wide_k.select(0, block).select(1, slot).copy_(read_back(keys[p]));
          wide_v.select(0, block).select(1, slot).copy_(read_back(values[p]));
        }
        std::vector<int64_t> positions;
        std::vector<const int32_t*> tables;
        std::vector<at::Tensor> rows, rounded_rows;
        for (int64_t p = n - chunk; p < n; ++p) {
          positions.push_back(p);
          tables.push_back(table.data());
          rows.push_back(at::stack({queries[p], keys[p], values[p]}));
          rounded_rows.push_back(at::stack({queries[p], read_back(keys[p]), read_back(values[p])}));
        }
        const auto qkv = at::stack(rows).contiguous(), rounded = at::stack(rounded_rows).contiguous();   // [chunk, 3, H, D]
        const auto element = *nn::kv_element_of(narrow_k);
        auto out = at::empty({chunk, h, d}), want = at::empty({chunk, h, d});
        kernels::paged_attention(qkv.const_data_ptr<float>(), narrow_k.mutable_data_ptr(), narrow_v.mutable_data_ptr(), positions.data(),
                                 tables.data(), alibi ? slopes.const_data_ptr<float>() : nullptr, out.mutable_data_ptr<float>(),
                                 {chunk, h, d, bs, scale, element});
        kernels::paged_attention(rounded.const_data_ptr<float>(), wide_k.mutable_data_ptr(), wide_v.mutable_data_ptr(), positions.data(),
                                 tables.data(), alibi ? slopes.const_data_ptr<float>() : nullptr, want.mutable_data_ptr<float>(),
                                 {chunk, h, d, bs, scale});
        const std::string where = std::string(kernels::isa_name(isa)) + " " + c10::toString(dtype) + (alibi ? " alibi" : "");
        EXPECT_TRUE(at::equal(out, want)) << where << ": max diff " << (out - want).abs().max().item<double>();
        const auto pools_agree = [&] {
          return at::equal(nn::from_kv_storage(narrow_k, at::kFloat), wide_k) && at::equal(nn::from_kv_storage(narrow_v, at::kFloat), wide_v);
        };
        EXPECT_TRUE(pools_agree()) << where << ": the pools";
        if (isa != kernels::runnable_isas().back()) continue;
        // ATen's path over the narrow pool as it stood before the chunk (the kernel has written the chunk)
        for (int64_t p = n - chunk; p < n; ++p) {
          narrow_k.select(0, table[static_cast<size_t>(p / bs)]).select(1, p % bs).zero_();
          narrow_v.select(0, table[static_cast<size_t>(p / bs)]).select(1, p % bs).zero_();
        }
        nn::PagedRows paged;
        paged.block_size = bs;
        paged.positions = positions;
        paged.tables = tables;
        nn::LayerKv kv{narrow_k, narrow_v, &paged};
        const auto aten = nn::aten_paged_attention(qkv.view({chunk, 1, 3 * h * d}), kv, h, alibi ? slopes : at::Tensor());
        EXPECT_LT((aten.view({chunk, h, d}) - want).abs().max().item<double>(), 1e-5) << where << ": ATen's path";
        EXPECT_TRUE(pools_agree()) << where << ": ATen's writes";
      }
    }
}

namespace {

ModelConfig tiny(const std::string& family) {
  ModelConfig c;
  c.family = family;
  c.n_layer = 2, c.n_head = 2, c.n_embd = 32, c.block_size = 64, c.vocab_size = 512;
  c.init_std = 0.5;   // weights large enough that every token depends on the whole context (at 0.02 they repeat one)
  return c;
}

std::shared_ptr<nn::CausalLM> random_model(const std::string& family) {
  at::manual_seed(32);
  nn::LayerFactory f;
  auto m = nn::model_as<nn::CausalLM>(build_model(tiny(family), f), "the test");
  m->eval();
  return m;
}

}  // namespace

class ServeFamilies : public ::testing::TestWithParam<const char*> {};

TEST_P(ServeFamilies, ContinuousBatchingWithPreemptionGivesEachRequestItsOneAtATimeGreedyTokens) {
  const auto model = random_model(GetParam());
  const auto tok = Tokenizer::load(test::small_corpus().tokenizer);
  const std::vector<std::string> prompts = {"In the beginning God created the heaven and the earth.", "And God said",
                                            "The LORD is my shepherd; I shall not want. He maketh me to lie down", "Jesus wept.",
                                            "For God so loved the world"};
  SamplingConfig greedy;
  greedy.greedy = true;
  greedy.max_tokens = 14;
  // With the model's fp32 cache, and with caches of fp16, bf16 and int8 (kv_element.h) on both sides.
  int64_t fp32_cache_bytes = 0;   // the generator's cache for the last prompt, which the others measure against
  for (const std::optional<at::ScalarType> kv :
       {std::optional<at::ScalarType>(), std::optional(at::kHalf), std::optional(at::kBFloat16), std::optional(at::kChar)}) {
    model->set_kv_dtype(kv);
    const std::string what = std::string(GetParam()) + (kv ? std::string(" ") + c10::toString(*kv) + " cache" : "");
    // The reference: each prompt alone through the generator (contiguous cache, prefill in one forward).
    Generator gen(model, tok, at::kCPU);
    std::vector<std::string> expected_text;
    for (const auto& p : prompts) expected_text.push_back(gen.generate({p}, greedy)[0].text);
    // Its cache's bytes: 16 bits half of fp32's; int8 rows of 16 values and a 4-byte scale, 20 of 64.
    const int64_t bytes = gen.last_timing().kv_cache_bytes;
    if (!kv) fp32_cache_bytes = bytes;
    EXPECT_GT(fp32_cache_bytes, 0) << what;
    EXPECT_EQ(bytes * (!kv ? 1 : *kv == at::kChar ? 64 : 2), fp32_cache_bytes * (kv && *kv == at::kChar ? 20 : 1)) << what;

    // 14 blocks of 4 positions for 5 requests of 17 to 47 positions: preemption is certain; steps of at
    // most 6 tokens split every prompt into chunks.
    serve::BatchEngine engine(model, tok, {.block_size = 4, .num_blocks = 14, .max_step_tokens = 6, .max_running = 4});
    std::vector<serve::Completion> done(prompts.size());
    std::vector<std::string> streamed(prompts.size());
    auto submit = [&](size_t i) {
      serve::EngineRequest r;
      r.prompt = tok.encode(prompts[i], /*add_special=*/true);
      r.sampling = greedy;
      r.on_text = [&, i](const std::string& piece) { streamed[i] += piece; };
      r.on_done = [&, i](const serve::Completion& c) { done[i] = c; };
      engine.submit(std::move(r));
    };
    submit(0), submit(1);
    for (int s = 0; s < 3; ++s) engine.step();
    submit(2), submit(3);
    for (int s = 0; s < 5; ++s) engine.step();
    submit(4);
    for (int s = 0; s < 2000 && engine.step(); ++s) {}
    const auto stats = engine.stats();
    EXPECT_GT(stats.preemptions, 0) << what << ": the pool was meant to force preemption";
    EXPECT_EQ(stats.blocks_used, 0);
    EXPECT_EQ(stats.running + stats.waiting, 0);
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(done[i].text, expected_text[i]) << what << " request " << i;
      EXPECT_EQ(streamed[i], done[i].text) << "request " << i << ": the streamed pieces add up to the completion";
      EXPECT_FALSE(done[i].finish_reason.empty()) << "request " << i << " never finished";
    }
  }
}

TEST_P(ServeFamilies, TheEngineOnAtensPagedAttentionGivesTheGeneratorsGreedyTokens) {
  // The path a GPU serves on (paged_attention_aten.h), taken here by a double-precision model (the CPU
  // kernel is fp32's): the pool follows the model's dtype, and every request its one-at-a-time tokens,
  // with prompts in chunks, requests joining mid-run and preemption. No on_text here: a completion ending
  // at its length inside a character (BLOOM's byte tokens) still ends with those bytes, as the generator's.
  const auto model = random_model(GetParam());
  model->to(at::kDouble);
  const auto tok = Tokenizer::load(test::small_corpus().tokenizer);
  const std::vector<std::string> prompts = {"In the beginning God created the heaven and the earth.", "And God said",
                                            "The LORD is my shepherd; I shall not want.", "Jesus wept."};
  SamplingConfig greedy;
  greedy.greedy = true;
  greedy.max_tokens = 12;
  Generator gen(model, tok, at::kCPU);
  serve::BatchEngine engine(model, tok, {.block_size = 4, .num_blocks = 12, .max_step_tokens = 6, .max_running = 3});
  std::vector<serve::Completion> done(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    serve::EngineRequest r;
    r.prompt = tok.encode(prompts[i], /*add_special=*/true);
    r.sampling = greedy;
    r.on_done = [&, i](const serve::Completion& c) { done[i] = c; };
    engine.submit(std::move(r));
    engine.step();
  }
  for (int s = 0; s < 2000 && engine.step(); ++s) {}
  EXPECT_GT(engine.stats().preemptions, 0) << "the pool was meant to force preemption";
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(done[i].text, gen.generate({prompts[i]}, greedy)[0].text) << GetParam() << " request " << i;
}

TEST_P(ServeFamilies, AFusedBlockStepOverPagedBlocksGivesTheOpByOpStepsBits) {
  // Serving's steps of prompt chunks and decoding tokens ([N, 1, C], paged_attention.h) through
  // kernels/cpu/decode_block.h and op by op, each over its own pool: the same logits, bit for bit, and
  // the same keys and values left in the blocks (BLOOM's ALiBi included, which the paged kernel adds).
  const auto model = random_model(GetParam());
  const nn::KernelPath ours = nn::KernelPath::Ours;
  struct Reset {
    ~Reset() { nn::set_kernel_policy({}); }
  } reset;
  serve::KvBlocks fused_pool(*model, 8, 4), ops_pool(*model, 8, 4);
  std::vector<int32_t> t0, t1;   // the two sequences' tables, the same blocks in both pools
  ASSERT_TRUE(fused_pool.grow(t0, 9) && fused_pool.grow(t1, 7));
  std::vector<int32_t> u0, u1;
  ASSERT_TRUE(ops_pool.grow(u0, 9) && ops_pool.grow(u1, 7));
  ASSERT_EQ(t0, u0);
  ASSERT_EQ(t1, u1);
  at::manual_seed(4);
  const auto ids0 = at::randint(0, 512, {9}, at::kLong), ids1 = at::randint(0, 512, {7}, at::kLong);
  // (sequence, first position, tokens) a step: chunks of both prompts, then a chunk beside a decoding token, then decoding.
  const std::vector<std::vector<std::array<int64_t, 3>>> steps = {{{0, 0, 3}, {1, 0, 2}}, {{0, 3, 1}, {1, 2, 3}}, {{0, 4, 1}, {1, 5, 1}},
                                                                  {{0, 5, 1}, {1, 6, 1}}};
  for (size_t k = 0; k < steps.size(); ++k) {
    serve::StepPlan plan;
    plan.tables = {t0, t1};
    for (const auto& [seq, from, n] : steps[k]) {
      for (int64_t p = from; p < from + n; ++p) {
        plan.ids.push_back((seq == 0 ? ids0 : ids1)[p].item<int64_t>());
        plan.positions.push_back(p);
        plan.table_of.push_back(seq);
      }
      plan.logit_rows.push_back(static_cast<int64_t>(plan.ids.size()) - 1);
    }
    auto run = [&](serve::KvBlocks& pool, bool fused) {
      nn::KernelPolicy policy{ours, ours, ours, ours, ours, ours};
      policy.fused_decode_block = fused;
      nn::set_kernel_policy(policy);
      return serve::forward_plan(*model, pool, plan);
    };
    const uint64_t before = kernels::decode_block_steps();
    const auto fused = run(fused_pool, true);
    EXPECT_EQ(kernels::decode_block_steps() - before, 2u) << GetParam() << " step " << k << ": both blocks fused";
    const auto by_ops = run(ops_pool, false);
    EXPECT_TRUE(at::equal(fused, by_ops)) << GetParam() << " step " << k << ": max diff " << (fused - by_ops).abs().max().item<float>();
  }
  nn::PagedRows none;
  const auto fused_cache = fused_pool.cache_for(none), ops_cache = ops_pool.cache_for(none);
  for (size_t l = 0; l < fused_cache.layers.size(); ++l)
    EXPECT_TRUE(at::equal(fused_cache.layers[l].k, ops_cache.layers[l].k) && at::equal(fused_cache.layers[l].v, ops_cache.layers[l].v))
        << GetParam() << " layer " << l << ": the pools' keys and values";
}

INSTANTIATE_TEST_SUITE_P(Families, ServeFamilies, ::testing::Values("gpt", "opt", "bloom"),
                         [](const auto& info) { return std::string(info.param); });

// The nucleus as the whole vocabulary sorted gives it, against nucleus_logits, which sorts only the
// largest logits while they can hold it: peaked rows (a nucleus of a few tokens), flat ones (most of a
// 20000-token vocabulary, past every candidate count) and rows with tokens already masked out.
TEST(KvCacheOption, EachChoiceNamesItsDtypeAndAnythingElseIsRefusedWithTheValidOnes) {
  EXPECT_EQ(parse_kv_cache("auto"), std::nullopt);
  EXPECT_EQ(parse_kv_cache("fp32"), at::kFloat);
  EXPECT_EQ(parse_kv_cache("fp16"), at::kHalf);
  EXPECT_EQ(parse_kv_cache("bf16"), at::kBFloat16);
  EXPECT_EQ(parse_kv_cache("int8"), at::kChar);
  try {
    parse_kv_cache("fp8");
    ADD_FAILURE() << "fp8 was taken";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "--kv-cache \"fp8\" is not a KV cache dtype (valid: auto, fp32, fp16, bf16, int8)");
  }
  // The pool a 16-bit cache gets from the same memory: twice the blocks of an fp32 model's.
  const auto model = random_model("gpt");
  const int64_t fp32_block = serve::KvBlocks::block_bytes(*model, 16);
  model->set_kv_dtype(at::kHalf);
  EXPECT_EQ(serve::KvBlocks::block_bytes(*model, 16) * 2, fp32_block);
  EXPECT_EQ(serve::KvBlocks(*model, 3, 16).cache_for({}).layers[0].k.scalar_type(), at::kHalf);
  // int8: heads of 16 values take 16 bytes and a 4-byte scale against 64 bytes.
  model->set_kv_dtype(at::kChar);
  EXPECT_EQ(serve::KvBlocks::block_bytes(*model, 16) * 64, fp32_block * 20);
  const auto pool = serve::KvBlocks(*model, 3, 16).cache_for({}).layers[0].k;
  EXPECT_EQ(pool.scalar_type(), at::kChar);
  EXPECT_EQ(pool.size(3), 20);
}

TEST(Sampling, TheNucleusFromTheLargestLogitsIsTheOneTheWholeSortGives) {
  at::manual_seed(11);
  const auto whole_sort = [](const at::Tensor& logits, double top_p) {
    auto [sorted, order] = logits.sort(-1, /*descending=*/true);
    auto probs = sorted.softmax(-1);
    sorted = sorted.masked_fill((probs.cumsum(-1) - probs) > top_p, -INFINITY);
    return at::full_like(logits, -INFINITY).scatter(-1, order, sorted);
  };
  const int64_t v = 20000;
  at::Tensor logits = at::randn({5, v});
  logits[0].mul_(8.0);    // peaked
  logits[1].mul_(0.01);   // nearly flat
  logits[3].narrow(0, 100, v - 100).fill_(-INFINITY);   // a top-k or padding mask before it
  logits[4].mul_(2.0);
  // Not nearer 1: where the tail holds under 1e-5, where float32 sums cross top_p depends on their order.
  for (double top_p : {1e-6, 0.05, 0.5, 0.9, 0.99}) {
    for (int64_t rows : {1, 5}) {   // alone and in a batch with the flat row
      const at::Tensor in = rows == 1 ? logits.narrow(0, 0, 1) : logits;
      const at::Tensor got = nucleus_logits(in, top_p), want = whole_sort(in, top_p);
      EXPECT_TRUE(at::equal(at::isinf(got), at::isinf(want))) << "top_p " << top_p << " rows " << rows;
      EXPECT_TRUE(at::equal(got.masked_fill(at::isinf(got), 0), want.masked_fill(at::isinf(want), 0))) << "top_p " << top_p;
      const at::Tensor kept = at::isfinite(got).sum(-1);
      EXPECT_TRUE((kept >= 1).all().item<bool>()) << "top_p " << top_p;   // the most likely token always stays
    }
  }
  // The flat row's nucleus at 0.9 is most of the vocabulary: the candidates grew to the whole sort.
  EXPECT_GT(at::isfinite(nucleus_logits(logits.narrow(0, 1, 1), 0.9)).sum().item<int64_t>(), 15000);
}

TEST(ServeEngine, ACancelledRequestFinishesAtTheNextStepAndGivesItsBlocksBack) {
  const auto model = random_model("gpt");
  const auto tok = Tokenizer::load(test::small_corpus().tokenizer);
  serve::BatchEngine engine(model, tok, {.block_size = 4, .num_blocks = 32});
  std::string reason;
  serve::EngineRequest r;
  r.prompt = tok.encode("In the beginning God created the heaven and the earth.", true);
  r.sampling.greedy = true;
  r.sampling.max_tokens = 40;
  r.on_done = [&](const serve::Completion& c) { reason = c.finish_reason; };
  const int64_t id = engine.submit(std::move(r));
  for (int s = 0; s < 3; ++s) engine.step();
  EXPECT_GT(engine.stats().blocks_used, 0);
  engine.cancel(id);
  engine.step();
  EXPECT_EQ(reason, "cancelled");
  EXPECT_EQ(engine.stats().blocks_used, 0);
  EXPECT_FALSE(engine.step()) << "nothing left to run";
}

TEST(ServeEngine, RequestsThatCannotRunAreRefusedWithWhatWouldFit) {
  const auto model = random_model("gpt");
  const auto tok = Tokenizer::load(test::small_corpus().tokenizer);
  serve::BatchEngine engine(model, tok, {.block_size = 4, .num_blocks = 8});
  auto request = [](std::vector<int> prompt, int64_t max_tokens) {
    serve::EngineRequest r;
    r.prompt = std::move(prompt);
    r.sampling.max_tokens = max_tokens;
    return r;
  };
  EXPECT_EQ(error_of([&] { engine.submit(request({}, 4)); }), "the prompt has no tokens");
  EXPECT_EQ(error_of([&] { engine.submit(request(std::vector<int>(64, 5), 4)); }),
            "the prompt has 64 tokens but the model's context is 64 (at most 63 leave room for a completion)");
  EXPECT_NE(error_of([&] { engine.submit(request(std::vector<int>(20, 5), 20)); }).find("need 10 KV blocks but the pool has 8"),
            std::string::npos);
  EXPECT_EQ(error_of([&] { engine.submit(request(std::vector<int>(20, 5), 12)); }), "(no error)");
}

TEST(CompletionApi, RequestsParseAsOpenAiClientsSendThemAndBadOnesGetA4xxNamingTheField) {
  const serve::ServeLimits limits{.max_body_bytes = 1 << 20, .max_tokens = 100, .max_choices = 4, .max_queue = 8};
  const auto r = serve::parse_completion_request(
      R"({"model": "m", "prompt": ["a", "b"], "max_tokens": 7, "temperature": 0, "top_p": 0.5, "stop": "\n", "seed": 3,
          "n": 2, "echo": true, "logprobs": 2, "stream": true, "stream_options": {"include_usage": true}, "user": "u",
          "presence_penalty": 0, "frequency_penalty": 0, "best_of": 1, "logit_bias": {}, "suffix": null})",
      limits, 512);
  EXPECT_EQ(r.prompts, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(r.max_tokens, 7);
  EXPECT_EQ(r.temperature, 0.0);
  EXPECT_EQ(r.stop, std::vector<std::string>{"\n"});
  EXPECT_EQ(r.seed, 3u);
  EXPECT_TRUE(r.echo && r.stream && r.include_usage);
  EXPECT_EQ(r.logprobs, 2);
  const auto ids = serve::parse_completion_request(R"({"prompt": [[1, 2], [3]], "max_tokens": 4.0})", limits, 512);
  EXPECT_EQ(ids.prompt_ids, (std::vector<std::vector<int>>{{1, 2}, {3}}));
  EXPECT_EQ(ids.max_tokens, 4);
  EXPECT_EQ(serve::parse_completion_request(R"({"prompt": "x"})", limits, 512).max_tokens, 16) << "OpenAI's default";

  auto refused = [&](const std::string& body) -> std::pair<int, std::string> {
    try {
      serve::parse_completion_request(body, limits, 512);
    } catch (const serve::ApiError& e) {
      return {e.status, std::string(e.what()) + " [" + e.param + "]"};
    }
    return {0, "(accepted)"};
  };
  EXPECT_EQ(refused("{\"prompt\": \"x\",").second, "the body is not valid JSON (at byte 16) []");
  EXPECT_EQ(refused("[1]").second, "the body must be a JSON object, not array []");
  EXPECT_EQ(refused(R"({"max_tokens": 3})").second, "'prompt' is required [prompt]");
  EXPECT_EQ(refused(R"({"prompt": "x", "max_tokens": 101})").second, "'max_tokens' must be an integer from 1 to 100 (got 101) [max_tokens]");
  EXPECT_EQ(refused(R"({"prompt": "x", "max_tokens": 1e300})").first, 400);
  EXPECT_EQ(refused("11111E1111111110!1]").first, 400) << "a number beyond double's range (found by libFuzzer)";
  EXPECT_EQ(refused(R"({"prompt": "x", "temperature": "hot"})").second, "'temperature' must be a number (got \"hot\") [temperature]");
  EXPECT_EQ(refused(R"({"prompt": [1, "a"]})").first, 400);
  EXPECT_EQ(refused(R"({"prompt": [512]})").second, "'prompt' must be an integer from 0 to 511 (got 512) [prompt]");
  EXPECT_EQ(refused(R"({"prompt": ["a", "b", "c"], "n": 2})").second,
            "3 prompts x n = 2 asks for 6 completions; this server allows 4 a request [n]");
  EXPECT_EQ(refused(R"({"prompt": "x", "frequency_penalty": 0.5})").second, "'frequency_penalty' other than 0 is not supported [frequency_penalty]");
  EXPECT_EQ(refused(R"({"prompt": "x", "stream_options": {"include_usage": true}})").second, "'stream_options' needs 'stream': true [stream_options]");
  EXPECT_EQ(refused(R"({"prompt": "x", "tools": []})").second, "unrecognized request argument 'tools' [tools]");
  for (const auto& [status, _] : {refused("{}"), refused("null"), refused(R"({"prompt": []})"), refused(R"({"prompt": [[]]})")})
    EXPECT_EQ(status, 400);
}
