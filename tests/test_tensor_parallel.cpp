// Tensor parallelism against one process: each rank is a thread with its own Gloo groups on
// 127.0.0.1. A tiny model of every family is built once whole (the reference) and once split on 2 and
// 4 ranks from the same weights; the loss, every gradient (each rank's piece of the whole gradient)
// and the losses after three SGD steps must agree within 1e-5 relative. The communication counters
// must equal the layer plan's formula.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "models/registry.h"
#include "src/dist/runtime.h"
#include "src/nn/causal_lm.h"
#include "src/nn/encoder.h"
#include "src/nn/random_stream.h"
#include "src/nn/shard.h"
#include "src/parallel/sequence_attention.h"
#include "src/parallel/tensor_parallel_1d.h"
#include "src/parallel/tensor_parallel_2d.h"
#include "src/parallel/tensor_parallel_3d.h"
#include "tests/support/test_support.h"

using namespace colossal;

namespace {

using LossFn = std::function<at::Tensor(nn::Model&)>;

constexpr int64_t kBatch = 2, kSeq = 8, kVocab = 64, kSteps = 3;
constexpr double kLr = 0.5;

ModelConfig tiny(const std::string& family) {
  ModelConfig c;
  c.family = family;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 32;
  c.block_size = 16;
  c.vocab_size = kVocab;
  c.dropout = 0.0;
  if (family == "bert") c.head = "mlm";
  if (family == "vit") c.image_size = 8, c.patch_size = 4, c.channels = 3, c.num_labels = 4;
  return c;
}

// Fixed inputs, drawn once from their own generator so every rank and the reference see the same.
struct Inputs {
  at::Tensor ids, targets, images, labels;
};
const Inputs& inputs() {
  static const Inputs in = [] {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(1234);
    Inputs i;
    i.ids = at::randint(kVocab, {kBatch, kSeq}, gen, at::kLong);
    i.targets = at::randint(kVocab, {kBatch, kSeq}, gen, at::kLong);
    i.targets[0][3] = -100;   // an ignored target
    i.images = at::randn({kBatch, 3, 8, 8}, gen);
    i.labels = at::randint(4, {kBatch}, gen, at::kLong);
    return i;
  }();
  return in;
}

at::Tensor loss_of(nn::Model& m) {
  const Inputs& in = inputs();
  if (auto* lm = dynamic_cast<nn::CausalLM*>(&m)) return lm->loss(in.ids, in.targets);
  if (auto* mlm = dynamic_cast<nn::MaskedLM*>(&m)) {
    const at::Tensor h = mlm->encode({.ids = in.ids});                              // [B, T, C]
    const at::Tensor scored = at::arange(0, kBatch * kSeq, 3, at::kLong);          // every third position
    const at::Tensor logits = mlm->mlm_logits(h.reshape({-1, h.size(-1)}).index_select(0, scored));
    return at::cross_entropy_loss(logits, in.targets.reshape({-1}).index_select(0, scored).clamp_min(0));
  }
  auto& vit = dynamic_cast<nn::ImageClassifier&>(m);
  return at::cross_entropy_loss(vit.classify_images(inputs().images), inputs().labels);
}

// What one process computes: the loss of each step, and the first step's gradients.
struct Reference {
  std::map<std::string, at::Tensor> initial, first_grads;
  std::vector<double> losses;
};

void sgd_step(nn::Model& m) {
  at::NoGradGuard no_grad;
  for (auto& p : m.parameters()) {
    p.sub_(p.grad(), kLr);
    p.mutable_grad().zero_();
  }
}

Reference reference(const ModelConfig& c, const LossFn& loss_fn = loss_of) {
  at::manual_seed(7);
  nn::LayerFactory plain;
  auto m = build_model(c, plain);
  Reference r;
  for (const auto& item : m->named_parameters()) r.initial[item.key()] = item.value().detach().clone();
  for (int64_t s = 0; s < kSteps; ++s) {
    at::Tensor loss = loss_fn(*m);
    loss.backward();
    r.losses.push_back(loss.item<double>());
    if (s == 0)
      for (const auto& item : m->named_parameters()) r.first_grads[item.key()] = item.value().grad().clone();
    sgd_step(*m);
  }
  return r;
}

void expect_close(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const double err = (got - want).abs().max().item<double>(), scale = want.abs().max().item<double>();
  EXPECT_LE(err, 1e-5 * scale + 1e-7) << what << ": max difference " << err << " against max " << scale;
}

// Each parameter of `m` set to its piece of the whole tensor of the same name in `whole`.
void copy_pieces(nn::Model& m, const std::map<std::string, at::Tensor>& whole) {
  at::NoGradGuard no_grad;
  for (auto& item : m.named_parameters()) item.value().copy_(item.shard().local_of(whole.at(item.key())));
}

dist::MeshShape tp_mesh(int64_t ranks) {
  dist::MeshShape m;
  m.size[static_cast<int>(dist::Dim::tp)] = ranks;
  return m;
}

// The family's model split over `ranks` ranks against one process, loss and gradients and three steps.
// `tokens`: Megatron-style sequence parallelism, the blocks' tokens split between their layers.
void check_family(const std::string& family, int64_t ranks, bool tokens = false) {
  const ModelConfig c = tiny(family);
  const Reference ref = reference(c);
  auto errors = test::run_ranks(
      ranks,
      [&](int64_t rank, dist::Runtime& rt) {
        parallel::TensorParallel1d f(rt.group(dist::Dim::tp));
        f.split_block_tokens(tokens);
        auto m = build_model(c, f, /*initialise=*/false);
        copy_pieces(*m, ref.initial);
        int64_t split = 0;
        for (const auto& item : m->named_parameters()) split += item.shard().split();
        EXPECT_EQ(split, 6 * c.n_layer + (family == "vit" ? 0 : 1)) << "split parameters";   // qkv and fc weights and biases, two row weights; the vocabulary
        for (int64_t s = 0; s < kSteps; ++s) {
          at::Tensor loss = loss_of(*m);
          loss.backward();
          EXPECT_NEAR(loss.item<double>(), ref.losses[static_cast<size_t>(s)], 1e-5 * std::abs(ref.losses[0]))
              << family << " rank " << rank << " step " << s;
          if (s == 0)
            for (const auto& item : m->named_parameters())
              expect_close(item.value().grad(), item.shard().local_of(ref.first_grads.at(item.key())),
                           family + " rank " + std::to_string(rank) + " gradient of " + item.key());
          sgd_step(*m);
        }
      },
      60, tp_mesh(ranks));
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << family << " rank " << r;
}

}  // namespace

TEST(TensorParallel1d, GptOnTwoAndFourRanksEqualsOneProcessAfterThreeSteps) {
  check_family("gpt", 2);
  check_family("gpt", 4);
}

TEST(TensorParallel1d, OptOnTwoAndFourRanksEqualsOneProcessAfterThreeSteps) {
  check_family("opt", 2);
  check_family("opt", 4);
}

TEST(TensorParallel1d, BloomWithEachRanksAlibiSlopesEqualsOneProcess) {
  check_family("bloom", 2);
  check_family("bloom", 4);
}

TEST(TensorParallel1d, BertMaskedLmEqualsOneProcess) {
  check_family("bert", 2);
  check_family("bert", 4);
}

TEST(TensorParallel1d, VitEqualsOneProcess) {
  check_family("vit", 2);
  check_family("vit", 4);
}

TEST(TensorParallel1d, MegatronSequenceSplitOfTheBlocksTokensEqualsOneProcessForEveryTextFamily) {
  for (const char* family : {"gpt", "opt", "bloom", "bert"})
    for (int64_t ranks : {2, 4}) check_family(family, ranks, /*tokens=*/true);   // 8 tokens: 4 or 2 a rank
}

TEST(TensorParallel1d, FusedQkvRowsAreSplitPerHeadNotAsOneRange) {
  // [q; k; v] of 4 rows each on 2 ranks: rank 1 holds q's rows 2-3, k's 6-7 and v's 10-11.
  const nn::ShardSpec s = nn::ShardSpec::along(0, 2, 1, 3);
  const at::Tensor whole = at::arange(12, at::kFloat).unsqueeze(1);
  EXPECT_TRUE(at::equal(s.local_of(whole).squeeze(1), at::tensor({2.f, 3.f, 6.f, 7.f, 10.f, 11.f})));
  const nn::ShardSpec s0 = nn::ShardSpec::along(0, 2, 0, 3);
  EXPECT_TRUE(at::equal(s.assemble({s0.local_of(whole), s.local_of(whole)}), whole));
  EXPECT_EQ(s.full_shape({6, 1}), (std::vector<int64_t>{12, 1}));
}

namespace {

// What the tensor-parallel group carried in one forward and backward of the tiny GPT at 2 ranks, each
// rank's (`tokens`: with the blocks' tokens split, Megatron-style).
std::vector<dist::CommCounters> step_traffic(bool tokens) {
  const ModelConfig c = tiny("gpt");
  const Reference ref = reference(c);
  std::vector<dist::CommCounters> counted(2);
  auto errors = test::run_ranks(
      2,
      [&](int64_t rank, dist::Runtime& rt) {
        dist::Group& tp = rt.group(dist::Dim::tp);
        parallel::TensorParallel1d f(tp);
        f.split_block_tokens(tokens);
        auto m = build_model(c, f, /*initialise=*/false);
        copy_pieces(*m, ref.initial);
        tp.take_counters();
        loss_of(*m).backward();
        counted[static_cast<size_t>(rank)] = tp.take_counters();
      },
      60, tp_mesh(2));
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  return counted;
}

}  // namespace

TEST(TensorParallel1d, CommunicationPerStepEqualsTheLayerPlansFormula) {
  // GPT at 2 ranks, one forward and backward: forward all-reduces the embedding's lookup and each
  // sublayer's row-split output ([B, T, C] each: 1 + 2L), the loss's max and sums (N, 2N); backward
  // all-reduces the gradient entering each column split (qkv, fc: 2L) and the head's input (1).
  const ModelConfig c = tiny("gpt");
  const int64_t l = c.n_layer, n = kBatch * kSeq, activation = n * c.n_embd * 4;
  for (const dist::CommCounters& counted : step_traffic(false)) {
    EXPECT_EQ(counted.calls, (1 + 2 * l) + 2 + 2 * l + 1);
    EXPECT_EQ(counted.bytes, (1 + 2 * l) * activation + 4 * n + 4 * 2 * n + (2 * l + 1) * activation);
  }
}

TEST(TensorParallel1d, MegatronSequenceSplitTradesEachAllReduceForAGatherAndAReduceScatter) {
  // GPT at 2 ranks with the blocks' tokens split: forward all-reduces the embedding's lookup (1), gathers
  // tokens into each column split and reduce-scatters each row split's output (4L), joins the blocks'
  // tokens (1) and all-reduces the loss's max and sums (2); backward mirrors the block's four (4L),
  // gathers each column split's input again rather than having stored it (2L), sums the gradients of the
  // parameters used on each rank's tokens alone (two LayerNorms and two row biases a block: 6L), gathers
  // the blocks' input gradient (1) and all-reduces the head's input gradient (1).
  const int64_t l = tiny("gpt").n_layer;
  for (const dist::CommCounters& counted : step_traffic(true)) EXPECT_EQ(counted.calls, 1 + 4 * l + 1 + 2 + 4 * l + 2 * l + 6 * l + 1 + 1);
}

TEST(TensorParallel1d, SizesThatDoNotDivideAreRefusedNamingThem) {
  ModelConfig c = tiny("gpt");
  c.n_head = 3;
  c.n_embd = 48;
  auto errors = test::run_ranks(
      2,
      [&](int64_t, dist::Runtime& rt) {
        parallel::TensorParallel1d f(rt.group(dist::Dim::tp));
        const std::string e = test::error_of([&] { build_model(c, f, false); });
        EXPECT_NE(e.find("the attention heads of 3 does not divide among 2 ranks"), std::string::npos) << e;
      },
      60, tp_mesh(2));
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

TEST(RandomStream, AStreamContinuesItsOwnSequenceAndNeverTouchesTheDefaultGenerator) {
  at::manual_seed(5);
  const at::Tensor shared = at::rand({4});
  at::manual_seed(5);
  nn::RandomStream stream(99), other(100);
  const at::Tensor a = stream.uniform(4), b = stream.uniform(4);
  EXPECT_FALSE(at::equal(a, b));
  EXPECT_FALSE(at::equal(a, other.uniform(4)));
  EXPECT_TRUE(at::equal(at::rand({4}), shared)) << "the default generator continues as if nothing was drawn";
  const at::Tensor keep = stream.keep_mask({1000}, 0.25, c10::kCPU);
  EXPECT_EQ(keep.scalar_type(), at::kBool);
  EXPECT_NEAR(keep.to(at::kFloat).mean().item<double>(), 0.75, 0.05);
}

TEST(TensorParallel1d, AttentionDropoutDrawsFromEachRanksOwnStreamAndLeavesTheSharedOneInStep) {
  // Only the attention probabilities drop here: after a training step the default generator (what
  // replicated dropout draws from) is where it started on every rank, and the ranks' streams differ.
  ModelConfig c = tiny("opt");   // OPT has a rate for the attention probabilities of its own
  c.attn_dropout = 0.5;
  const Reference ref = reference(tiny("opt"));
  auto errors = test::run_ranks(
      2,
      [&](int64_t, dist::Runtime& rt) {
        dist::Group& tp = rt.group(dist::Dim::tp);
        parallel::TensorParallel1d f(tp, nn::ParamStorage::allocated, 1337);
        auto m = build_model(c, f, /*initialise=*/false);
        copy_pieces(*m, ref.initial);
        m->train();
        auto gen = at::detail::getDefaultCPUGenerator();
        at::Tensor before;
        {
          std::lock_guard<std::mutex> lock(gen.mutex());
          before = gen.get_state();
        }
        at::Tensor loss = loss_of(*m);
        loss.backward();
        EXPECT_NEAR(loss.item<double>(), ref.losses[0], 0.5 * std::abs(ref.losses[0])) << "dropout changed the loss, not its scale";
        {
          std::lock_guard<std::mutex> lock(gen.mutex());
          EXPECT_TRUE(at::equal(gen.get_state(), before));
        }
        const at::Tensor mine = f.region_random()->uniform(8);
        at::Tensor both = at::empty({16});
        tp.all_gather(both, mine, "streams");
        EXPECT_FALSE(at::equal(both.narrow(0, 0, 8), both.narrow(0, 8, 8))) << "each rank draws its own masks";
      },
      60, tp_mesh(2));
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

namespace {

dist::MeshShape sp_mesh(int64_t ranks, int64_t tensor = 1) {
  dist::MeshShape m;
  m.size[static_cast<int>(dist::Dim::sp)] = ranks;
  m.size[static_cast<int>(dist::Dim::tp)] = tensor;
  return m;
}

// One attention over a whole sequence (ATen's) against the same split across `ranks` sequence-parallel
// ranks: each rank's outputs and its tokens' gradients of q, k and v.
// `padded`: the second sequence's last keys are padding (a key mask over the whole sequence).
void check_sequence_attention(parallel::SequenceMode mode, int64_t ranks, bool causal, at::ScalarType dtype = at::kFloat,
                              bool padded = false) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(42);
  auto draw = [&] { return at::randn({2, 4, 16, 8}, gen).to(dtype); };
  const at::Tensor q = draw(), k = draw(), v = draw();
  const at::Tensor w = draw();   // the loss's weights, so every output element matters
  at::Tensor keys;               // [B, T], true: a real key
  std::optional<at::Tensor> mask;
  if (padded) {
    keys = at::ones({2, 16}, at::kBool);
    keys[1].narrow(0, 11, 5).fill_(false);   // whole ring blocks of padding at 4 ranks (2 tokens a chunk)
    mask = keys.view({2, 1, 1, 16});
    if (causal) mask = mask->logical_and(at::ones({16, 16}, at::kBool).tril());
  }
  const at::Tensor qr = q.clone().requires_grad_(), kr = k.clone().requires_grad_(), vr = v.clone().requires_grad_();
  const at::Tensor y = at::scaled_dot_product_attention(qr, kr, vr, mask, 0.0, causal && !padded);
  (y * w).sum().backward();
  const std::string name = std::to_string(static_cast<int>(mode)) + (causal ? " causal" : " full") + (padded ? " padded" : "") + " at " +
                           std::to_string(ranks);
  auto errors = test::run_ranks(
      ranks,
      [&](int64_t, dist::Runtime& rt) {
        dist::Group& sp = rt.group(dist::Dim::sp);
        const parallel::SequenceLayout layout = parallel::sequence_layout(mode, sp);
        auto mine = [&](const at::Tensor& t) { return layout.local(t.detach(), 2); };
        const at::Tensor ql = mine(q).requires_grad_(), kl = mine(k).requires_grad_(), vl = mine(v).requires_grad_();
        auto attention = parallel::make_sequence_attention(mode, sp);
        const at::Tensor yl = attention->attend(ql, kl, vl, causal, {}, keys);
        expect_close(yl, mine(y), name + " output");
        (yl * mine(w)).sum().backward();
        expect_close(ql.grad(), mine(qr.grad()), name + " dq");
        expect_close(kl.grad(), mine(kr.grad()), name + " dk");
        expect_close(vl.grad(), mine(vr.grad()), name + " dv");
      },
      60, sp_mesh(ranks));
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << name << " rank " << r;
}

}  // namespace

TEST(SequenceParallel, GatheredKeysAndValuesEqualWholeSequenceAttentionOnTwoAndFourRanks) {
  for (int64_t ranks : {2, 4})
    for (bool causal : {true, false}) check_sequence_attention(parallel::SequenceMode::split_gather, ranks, causal);
  check_sequence_attention(parallel::SequenceMode::split_gather, 2, false, at::kFloat, /*padded=*/true);
}

TEST(SequenceParallel, RingAttentionWithTheZigzagLayoutEqualsWholeSequenceAttentionOnTwoAndFourRanks) {
  for (int64_t ranks : {2, 4})
    for (bool causal : {true, false}) check_sequence_attention(parallel::SequenceMode::ring, ranks, causal);
  // double: the blocks' scores whole (the path other devices take) instead of the CPU's flash kernel
  check_sequence_attention(parallel::SequenceMode::ring, 4, true, at::kDouble);
}

TEST(SequenceParallel, RingAttentionWithPaddedKeysEqualsWholeSequenceAttentionOnTwoAndFourRanks) {
  // at 4 ranks some blocks hold only padding: a row that sees no real key there must add nothing
  for (int64_t ranks : {2, 4})
    for (bool causal : {false, true}) check_sequence_attention(parallel::SequenceMode::ring, ranks, causal, at::kFloat, /*padded=*/true);
  check_sequence_attention(parallel::SequenceMode::ring, 4, false, at::kDouble, /*padded=*/true);
}

TEST(SequenceParallel, AllToAllHeadExchangeEqualsWholeSequenceAttentionOnTwoAndFourRanks) {
  for (int64_t ranks : {2, 4})
    for (bool causal : {true, false}) check_sequence_attention(parallel::SequenceMode::all_to_all, ranks, causal);
  check_sequence_attention(parallel::SequenceMode::all_to_all, 2, false, at::kFloat, /*padded=*/true);
}

TEST(SequenceParallel, TheZigzagLayoutPairsAnEarlyChunkWithALateOne) {
  const parallel::SequenceLayout r0(4, 0, true), r3(4, 3, true), c1(4, 1, false);
  EXPECT_EQ(r0.chunks_of(0), (std::vector<int64_t>{0, 7}));
  EXPECT_EQ(r3.chunks_of(3), (std::vector<int64_t>{3, 4}));
  EXPECT_TRUE(at::equal(r3.positions(16), at::tensor({6, 7, 8, 9}, at::kLong)));
  EXPECT_TRUE(at::equal(c1.positions(16), at::tensor({4, 5, 6, 7}, at::kLong)));
}

namespace {

using RankLoss = std::function<at::Tensor(nn::Model&, const parallel::SequenceLayout&)>;

// `c` split across `ranks` sequence-parallel ranks (its layers across `tensor` 1D ranks), each rank's
// loss from `rank_loss` (its part of the batch, a mean whose average over the ranks is the batch's):
// the mean of the ranks' losses and of their gradients against one process's first step.
void expect_sequence_split_equals(const ModelConfig& c, const Reference& ref, parallel::SequenceMode mode, int64_t ranks, int64_t tensor,
                                  const std::string& name, const RankLoss& rank_loss) {
  auto errors = test::run_ranks(
      ranks * tensor,
      [&](int64_t rank, dist::Runtime& rt) {
        dist::Group &sp = rt.group(dist::Dim::sp), &tp = rt.group(dist::Dim::tp);
        std::unique_ptr<nn::LayerFactory> f;
        if (tensor > 1) f = std::make_unique<parallel::TensorParallel1d>(tp);
        else f = std::make_unique<nn::LayerFactory>();
        f->set_sequence_attention(parallel::make_sequence_attention(mode, sp));
        const parallel::SequenceLayout layout = parallel::sequence_layout(mode, sp);
        auto m = build_model(c, *f, /*initialise=*/false);
        copy_pieces(*m, ref.initial);
        at::Tensor loss = rank_loss(*m, layout);
        loss.backward();
        at::Tensor mean = loss.detach().clone().reshape({1});
        sp.all_reduce(mean, dist::Reduce::sum, "test loss");
        EXPECT_NEAR(mean.item<double>() / static_cast<double>(ranks), ref.losses[0], 1e-5 * ref.losses[0]) << name << " rank " << rank;
        for (const auto& item : m->named_parameters()) {
          at::Tensor g = item.value().grad().defined() ? item.value().grad().clone() : at::zeros_like(item.value());
          sp.all_reduce(g, dist::Reduce::sum, "test gradient");
          expect_close(g / static_cast<double>(ranks), item.shard().local_of(ref.first_grads.at(item.key())), name + " gradient of " + item.key());
        }
      },
      60, sp_mesh(ranks, tensor));
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << name << " rank " << r;
}

std::string split_name(const std::string& family, parallel::SequenceMode mode, int64_t ranks, int64_t tensor) {
  return family + " mode " + std::to_string(static_cast<int>(mode)) + " sequence " + std::to_string(ranks) + " tensor " + std::to_string(tensor);
}

// A causal LM family with its sequence split (each rank's loss a mean over its own tokens, all of
// equal count).
void check_sequence_family(const std::string& family, parallel::SequenceMode mode, int64_t ranks, int64_t tensor) {
  const ModelConfig c = tiny(family);
  const at::Tensor targets = inputs().targets.clamp_min(0);   // every token scored: equal counts on every rank
  const Reference ref = reference(c, [&](nn::Model& m) { return dynamic_cast<nn::CausalLM&>(m).loss(inputs().ids, targets); });
  expect_sequence_split_equals(c, ref, mode, ranks, tensor, split_name(family, mode, ranks, tensor),
                               [&](nn::Model& m, const parallel::SequenceLayout& layout) {
                                 return dynamic_cast<nn::CausalLM&>(m).loss(layout.local(inputs().ids, 1), layout.local(targets, 1),
                                                                            layout.positions(kSeq));
                               });
}

}  // namespace

TEST(SequenceParallel, GptOptAndBloomWithEachModeOnTwoAndFourRanksEqualOneProcess) {
  for (const char* family : {"gpt", "opt", "bloom"})   // BLOOM: ALiBi's bias over each rank's positions
    for (auto mode : {parallel::SequenceMode::split_gather, parallel::SequenceMode::ring, parallel::SequenceMode::all_to_all}) {
      check_sequence_family(family, mode, 2, 1);
      if (mode != parallel::SequenceMode::ring) check_sequence_family(family, mode, 4, 1);   // ring's 8 chunks of kSeq = 8: one token each
    }
  check_sequence_family("gpt", parallel::SequenceMode::ring, 4, 1);
}

TEST(SequenceParallel, TensorTimesSequenceOnFourRanksEqualsOneProcess) {
  check_sequence_family("gpt", parallel::SequenceMode::ring, 2, 2);
  check_sequence_family("opt", parallel::SequenceMode::all_to_all, 2, 2);
  check_sequence_family("bloom", parallel::SequenceMode::ring, 2, 2);
}

namespace {

// A grid test's batch: `rows` of every input a family takes (BERT's with padding and token types).
struct GridBatch {
  at::Tensor ids, targets, masked, types, mask, images, labels;   // masked: masked LM's targets
  GridBatch rows(int64_t first, int64_t n) const {
    auto r = [&](const at::Tensor& t) { return t.narrow(0, first, n); };
    return {r(ids), r(targets), r(masked), r(types), r(mask), r(images), r(labels)};
  }
};

GridBatch grid_batch(int64_t batch) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(99);
  GridBatch b;
  b.ids = at::randint(kVocab, {batch, kSeq}, gen, at::kLong);
  b.targets = at::randint(kVocab, {batch, kSeq}, gen, at::kLong);
  b.types = at::randint(2, {batch, kSeq}, gen, at::kLong);
  b.mask = at::ones({batch, kSeq}, at::kLong);
  for (int64_t i = 0; i < batch; i += 2) b.mask[i].narrow(0, kSeq - 1 - i % 3, 1 + i % 3).zero_();   // padded rows
  // masked LM scores every third real token (so the blocks score different counts)
  const at::Tensor scored = (at::arange(batch * kSeq, at::kLong).view({batch, kSeq}) % 3 == 0).logical_and(b.mask.to(at::kBool));
  b.masked = at::where(scored, b.targets, at::full_like(b.targets, -100));
  b.images = at::randn({batch, 3, 8, 8}, gen);
  b.labels = at::randint(4, {batch}, gen, at::kLong);
  return b;
}

// The loss of a part of the batch that is one of `parts` (the whole batch: 1) as the task computes it:
// the mean over its rows, or masked LM's sum over its scored tokens over the whole batch's count, times
// the parts; mean_over_row_blocks then gives the batch's loss.
at::Tensor grid_loss(nn::Model& m, const GridBatch& b, double parts, double scored, const at::Tensor& positions = {}) {
  if (auto* lm = dynamic_cast<nn::CausalLM*>(&m)) return lm->loss(b.ids, b.targets);
  if (auto* mlm = dynamic_cast<nn::MaskedLM*>(&m)) {
    const at::Tensor h = mlm->encode({.ids = b.ids, .token_types = b.types, .attention_mask = b.mask, .positions = positions});
    const at::Tensor logits = mlm->mlm_logits(h.reshape({-1, h.size(-1)}));
    return at::cross_entropy_loss(logits, b.masked.reshape({-1}), {}, at::Reduction::Sum) * (parts / scored);
  }
  if (auto* cls = dynamic_cast<nn::SequenceClassifier*>(&m))
    return at::cross_entropy_loss(cls->classify({.ids = b.ids, .token_types = b.types, .attention_mask = b.mask}), b.labels.remainder(2));
  return at::cross_entropy_loss(dynamic_cast<nn::ImageClassifier&>(m).classify_images(b.images), b.labels);
}

ModelConfig grid_config(const std::string& family) {
  if (family == "bert-cls") {
    ModelConfig c = tiny("bert");
    c.head = "classifier";
    return c;
  }
  if (family == "opt-narrow") {   // token embeddings narrower than the blocks: project_in and project_out
    ModelConfig c = tiny("opt");
    c.embed_dim = 16;
    return c;
  }
  return tiny(family);
}

// A family on a q x q grid (2D tensor parallelism), or `depth` of them (2.5D), or a q x q x q cube (3D),
// against one process: each row block's batch rows, the loss (the mean over the blocks), every gradient
// (each rank's block of the whole), and three SGD steps.
void check_family_grid(const std::string& family, int64_t q, int64_t depth = 1, bool cube = false) {
  const ModelConfig c = grid_config(family);
  const int64_t blocks = cube ? q * q : q * depth, batch = 2 * blocks;   // two rows a block
  const GridBatch all = grid_batch(batch);
  const double scored = all.masked.ge(0).sum().item<double>();
  const Reference ref = reference(c, [&](nn::Model& m) { return grid_loss(m, all, 1, scored); });
  const auto& losses = ref.losses;
  const int64_t ranks = cube ? q * q * q : depth * q * q;
  dist::MeshShape mesh = tp_mesh(ranks);
  mesh.tensor_grid = cube ? std::vector<int64_t>{q, q, q} : depth > 1 ? std::vector<int64_t>{depth, q, q} : std::vector<int64_t>{q, q};
  const std::string name = family + (cube ? " 3d" : depth > 1 ? " 2.5d" : " 2d");
  auto errors = test::run_ranks(
      ranks,
      [&](int64_t rank, dist::Runtime& rt) {
        std::unique_ptr<parallel::FeatureSplitFactory> f;
        int64_t block = 0;
        if (cube) {
          const std::array<dist::Group*, 3> axes{&rt.tensor_axis(0), &rt.tensor_axis(1), &rt.tensor_axis(2)};
          f = std::make_unique<parallel::TensorParallel3d>(axes);
          block = parallel::TensorParallel3d::row_block(axes);
        } else {
          const size_t a = depth > 1 ? 1 : 0;
          dist::Group &column = rt.tensor_axis(a), &row = rt.tensor_axis(a + 1);
          dist::Group* layers = depth > 1 ? &rt.tensor_axis(0) : nullptr;
          f = std::make_unique<parallel::TensorParallel2d>(column, row, nn::ParamStorage::allocated, layers);
          block = (layers ? layers->rank() * q : 0) + column.rank();
        }
        auto m = build_model(c, *f, /*initialise=*/false);
        copy_pieces(*m, ref.initial);
        const GridBatch mine = all.rows(block * 2, 2);
        for (int64_t s = 0; s < kSteps; ++s) {
          at::Tensor loss = parallel::mean_over_row_blocks(grid_loss(*m, mine, static_cast<double>(blocks), scored), f->batch_groups());
          loss.backward();
          EXPECT_NEAR(loss.item<double>(), losses[static_cast<size_t>(s)], 1e-5 * losses[0]) << name << " rank " << rank << " step " << s;
          if (s == 0)
            for (const auto& item : m->named_parameters())
              expect_close(item.value().grad(), item.shard().local_of(ref.first_grads.at(item.key())),
                           name + " rank " + std::to_string(rank) + " gradient of " + item.key());
          sgd_step(*m);
        }
      },
      60, mesh);
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << name << " rank " << r;
}

}  // namespace

TEST(TensorParallel2d, GptOptAndBloomOnATwoByTwoGridEqualOneProcessAfterThreeSteps) {
  for (const char* family : {"gpt", "opt", "bloom", "opt-narrow"}) check_family_grid(family, 2);
}

TEST(TensorParallel2d, BertWithPaddingBertClassifierAndVitOnATwoByTwoGridEqualOneProcess) {
  for (const char* family : {"bert", "bert-cls", "vit"}) check_family_grid(family, 2);
}

TEST(TensorParallel3d, GptOptAndBloomOnATwoCubedCubeEqualOneProcessAfterThreeSteps) {
  for (const char* family : {"gpt", "opt", "bloom"}) check_family_grid(family, 2, 1, /*cube=*/true);   // 8 ranks
}

TEST(TensorParallel3d, BertAndVitOnATwoCubedCubeEqualOneProcessAfterThreeSteps) {
  for (const char* family : {"bert", "vit"}) check_family_grid(family, 2, 1, /*cube=*/true);
}

TEST(TensorParallel25d, TwoGridsOfTwoByTwoEqualOneProcessAfterThreeSteps) {
  for (const char* family : {"gpt", "vit"}) check_family_grid(family, 2, 2);   // 8 ranks: q = 2, depth 2
}

namespace {

// BERT with padded sequences split: each rank encodes its tokens at their positions against every
// rank's real keys (the mask stays whole), and scores its masked tokens over the whole batch's count.
void check_sequence_encoder(parallel::SequenceMode mode, int64_t ranks, int64_t tensor = 1) {
  const ModelConfig c = tiny("bert");
  const GridBatch all = grid_batch(kBatch);
  const double scored = all.masked.ge(0).sum().item<double>();
  const Reference ref = reference(c, [&](nn::Model& m) { return grid_loss(m, all, 1, scored); });
  expect_sequence_split_equals(c, ref, mode, ranks, tensor, split_name("bert", mode, ranks, tensor),
                               [&](nn::Model& m, const parallel::SequenceLayout& layout) {
                                 GridBatch mine = all;
                                 for (at::Tensor* t : {&mine.ids, &mine.targets, &mine.masked, &mine.types}) *t = layout.local(*t, 1);
                                 return grid_loss(m, mine, static_cast<double>(ranks), scored, layout.positions(kSeq));
                               });
}

}  // namespace

namespace {

// ViT's sequence of patches split: every rank embeds the whole image, pads the 5 tokens to whole chunks
// (masked as keys) and keeps its own; the class token reaches every rank's classifier from rank 0, so
// every rank's loss is the batch's.
void check_sequence_vit(parallel::SequenceMode mode, int64_t ranks) {
  const ModelConfig c = tiny("vit");
  expect_sequence_split_equals(c, reference(c), mode, ranks, 1, split_name("vit", mode, ranks, 1),
                               [](nn::Model& m, const parallel::SequenceLayout&) { return loss_of(m); });
}

}  // namespace

TEST(SequenceParallel, VitWithItsPatchesPaddedToWholeChunksInEachModeEqualsOneProcess) {
  check_sequence_vit(parallel::SequenceMode::split_gather, 2);   // 5 tokens padded to 6
  check_sequence_vit(parallel::SequenceMode::ring, 2);           // to 8: 4 zigzag chunks of 2
  check_sequence_vit(parallel::SequenceMode::all_to_all, 2);
  check_sequence_vit(parallel::SequenceMode::ring, 4);           // 8 chunks of 1: three of padding only
}

TEST(SequenceParallel, BertWithPaddedSequencesInEachModeOnTwoAndFourRanksEqualsOneProcess) {
  for (auto mode : {parallel::SequenceMode::split_gather, parallel::SequenceMode::ring, parallel::SequenceMode::all_to_all}) {
    check_sequence_encoder(mode, 2);
    if (mode != parallel::SequenceMode::ring) check_sequence_encoder(mode, 4);
  }
  check_sequence_encoder(parallel::SequenceMode::ring, 4);   // one token a chunk: blocks of padding only
  check_sequence_encoder(parallel::SequenceMode::ring, 2, 2);   // with 1D tensor parallelism
}

TEST(TensorParallel2d, BlocksOfAWeightAssembleAcrossTheGridInRankOrder) {
  // W [4, 4] on a 2 x 2 grid: rank (i, j) holds W[out rows of j, in columns of i].
  const at::Tensor w = at::arange(16, at::kFloat).view({4, 4});
  std::vector<at::Tensor> pieces;
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 2; ++j) {
      const nn::ShardSpec s{{{1, 2, i, 1}, {0, 2, j, 1}}};
      pieces.push_back(s.local_of(w).contiguous());
    }
  EXPECT_TRUE(at::equal(pieces[1], w.narrow(0, 2, 2).narrow(1, 0, 2)));   // rank (0, 1)
  const nn::ShardSpec any{{{1, 2, 0, 1}, {0, 2, 0, 1}}};
  EXPECT_TRUE(at::equal(any.assemble(pieces), w));
  const nn::ShardSpec bias{{{-1, 2, 1, 1}, {0, 2, 1, 1}}};
  EXPECT_EQ(bias.copies(4), 2);
  EXPECT_EQ(bias.full_shape({2}), (std::vector<int64_t>{4}));
}
