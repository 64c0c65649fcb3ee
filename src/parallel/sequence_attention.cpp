// Sequence-parallel attention by gathering and by all-to-all: see sequence_attention.h (ring attention
// is in ring_attention.cpp).
#include "src/parallel/sequence_attention.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>

#include "src/core/error.h"
#include "src/dist/group.h"
#include "src/nn/alibi.h"
#include "src/nn/factory.h"

namespace colossal::parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

dist::Group* group_of(AutogradContext* ctx) { return reinterpret_cast<dist::Group*>(ctx->saved_data["group"].toInt()); }

// [B, H, Tl, D] on each rank -> [B, H, S * Tl, D], chunks in rank order; backward reduce-scatters.
struct GatherSequence : public torch::autograd::Function<GatherSequence> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, dist::Group* g) {
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(g);
    const at::Tensor shard = x.contiguous();
    const int64_t s = g->size();
    at::Tensor whole = at::empty({s * shard.numel()}, shard.options());
    g->all_gather(whole, shard.view({-1}), "sequence keys and values");
    const auto n = shard.sizes();
    return whole.view({s, n[0], n[1], n[2], n[3]}).permute({1, 2, 0, 3, 4}).reshape({n[0], n[1], s * n[2], n[3]});
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    dist::Group* g = group_of(ctx);
    const int64_t s = g->size();
    const auto n = grad[0].sizes();
    const at::Tensor whole = grad[0].reshape({n[0], n[1], s, n[2] / s, n[3]}).permute({2, 0, 1, 3, 4}).contiguous();   // [S, B, H, Tl, D]
    at::Tensor shard = at::empty({n[0], n[1], n[2] / s, n[3]}, grad[0].options());
    g->reduce_scatter(shard.view({-1}), whole.view({-1}), "sequence key and value gradients");
    return {shard, at::Tensor()};
  }
};

// Ulysses's exchanges. seq_to_heads: [B, H, Tl, D] (this rank's tokens, every head) -> [B, H/S, T, D]
// (every token, this rank's heads); heads_to_seq is its inverse. Each is the other's backward.
at::Tensor seq_to_heads_raw(const at::Tensor& x, dist::Group& g) {
  const int64_t s = g.size(), b = x.size(0), h = x.size(1), t = x.size(2), d = x.size(3);
  const at::Tensor in = x.reshape({b, s, h / s, t, d}).permute({1, 0, 2, 3, 4}).contiguous();   // [S (to), B, H/S, Tl, D]
  at::Tensor out = at::empty_like(in);                                                         // [S (from), B, H/S, Tl, D]
  g.all_to_all(out, in, "sequence to heads");
  return out.permute({1, 2, 0, 3, 4}).reshape({b, h / s, s * t, d});
}
at::Tensor heads_to_seq_raw(const at::Tensor& y, dist::Group& g) {
  const int64_t s = g.size(), b = y.size(0), hs = y.size(1), t = y.size(2) / s, d = y.size(3);
  const at::Tensor in = y.reshape({b, hs, s, t, d}).permute({2, 0, 1, 3, 4}).contiguous();   // [S (to: its chunk), B, H/S, Tl, D]
  at::Tensor out = at::empty_like(in);                                                      // [S (from: its heads), B, H/S, Tl, D]
  g.all_to_all(out, in, "heads to sequence");
  return out.permute({1, 0, 2, 3, 4}).reshape({b, s * hs, t, d});
}

struct SeqToHeads : public torch::autograd::Function<SeqToHeads> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, dist::Group* g) {
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(g);
    return seq_to_heads_raw(x, *g);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) { return {heads_to_seq_raw(grad[0], *group_of(ctx)), at::Tensor()}; }
};
struct HeadsToSeq : public torch::autograd::Function<HeadsToSeq> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& y, dist::Group* g) {
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(g);
    return heads_to_seq_raw(y, *g);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) { return {seq_to_heads_raw(grad[0], *group_of(ctx)), at::Tensor()}; }
};

// The sequence's first token [B, C] on every rank from the one holding it (rank 0: chunk 0 comes first
// in every layout); backward: that rank's gradient times the ranks (see nn::SequenceAttention).
at::Tensor first_token_of(const at::Tensor& x, dist::Group& g) {
  at::Tensor first = g.rank() == 0 ? x.select(1, 0).contiguous().clone() : at::zeros({x.size(0), x.size(2)}, x.options());
  g.all_reduce(first, dist::Reduce::sum, "sequence's first token");
  return first;
}

struct FirstToken : public torch::autograd::Function<FirstToken> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, dist::Group* g) {
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(g);
    ctx->saved_data["shape"] = x.sizes().vec();
    return first_token_of(x, *g);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    dist::Group* g = group_of(ctx);
    at::Tensor dx = at::zeros(ctx->saved_data["shape"].toIntVector(), grad[0].options());
    if (g->rank() == 0) dx.select(1, 0).copy_(grad[0] * static_cast<double>(g->size()));
    return {dx, at::Tensor()};
  }
};

// What the three modes share: the group, this rank's tokens, and dropout on them.
class SplitSequence : public nn::SequenceAttention {
 public:
  SplitSequence(dist::Group& g, bool zigzag) : group_(g), layout_(g.size(), g.rank(), zigzag) {}
  int64_t chunks() const override { return layout_.chunks(); }
  at::Tensor local_tokens(const at::Tensor& x) override { return layout_.local(x, 1); }
  at::Tensor first_token(const at::Tensor& x) override {
    return at::GradMode::is_enabled() && x.requires_grad() ? FirstToken::apply(x, &group_) : first_token_of(x, group_);
  }
  at::Tensor dropout(const at::Tensor& x, double p) override {
    TORCH_CHECK(x.dim() >= 2, "sequence-parallel dropout: expected [B, T, ...], got ", x.sizes());
    std::vector<int64_t> whole = x.sizes().vec();
    whole[1] *= layout_.ranks();
    return x * layout_.local(nn::dropout_noise(whole, p, x.options()), 1);
  }

 protected:
  dist::Group& group_;
  SequenceLayout layout_;
};

class GatheredAttention : public SplitSequence {
 public:
  explicit GatheredAttention(dist::Group& g) : SplitSequence(g, false) {}
  at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal, const at::Tensor& alibi,
                    const at::Tensor& keys) override {
    const at::Tensor kw = GatherSequence::apply(k, &group_), vw = GatherSequence::apply(v, &group_);   // [B, H, T, D]
    // this rank's queries sit at positions r * Tl + i of the whole sequence
    const int64_t t = kw.size(2);
    const at::Tensor qpos = layout_.positions(t).to(q.device()), kpos = at::arange(t, qpos.options());
    return at::scaled_dot_product_attention(q, kw, vw, scores_mask(qpos, kpos, causal, alibi, keys), 0.0, false);
  }
};

class AllToAllAttention : public SplitSequence {
 public:
  explicit AllToAllAttention(dist::Group& g) : SplitSequence(g, false) {}
  at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal, const at::Tensor& alibi,
                    const at::Tensor& keys) override {
    if (q.size(1) % group_.size() != 0)
      throw Error("sequence_mode \"all_to_all\": " + std::to_string(q.size(1)) + " heads on this rank do not split among " +
                  std::to_string(group_.size()) + " sequence-parallel ranks");
    auto heads = [&](const at::Tensor& x) { return SeqToHeads::apply(x, &group_); };
    const at::Tensor qh = heads(q), kh = heads(k), vh = heads(v);   // [B, H/S, T, D]: this rank's heads, whole sequences
    if (!alibi.defined() && !keys.defined())
      return HeadsToSeq::apply(at::scaled_dot_product_attention(qh, kh, vh, {}, 0.0, causal), &group_);
    const int64_t mine = qh.size(1), t = qh.size(2);
    const at::Tensor pos = at::arange(t, at::TensorOptions(at::kLong).device(q.device()));
    const at::Tensor slopes = alibi.defined() ? alibi.narrow(0, group_.rank() * mine, mine) : alibi;
    return HeadsToSeq::apply(at::scaled_dot_product_attention(qh, kh, vh, scores_mask(pos, pos, causal, slopes, keys), 0.0, false), &group_);
  }
};

class RingAttention : public SplitSequence {
 public:
  explicit RingAttention(dist::Group& g) : SplitSequence(g, true) {}
  at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal, const at::Tensor& alibi,
                    const at::Tensor& keys) override {
    return ring_attention(q, k, v, causal, layout_, group_, alibi, keys);
  }
};

}  // namespace

std::optional<at::Tensor> scores_mask(const at::Tensor& qpos, const at::Tensor& kpos, bool causal, const at::Tensor& alibi,
                                      const at::Tensor& keys) {
  const at::Tensor real = keys.defined() ? keys.index_select(1, kpos).view({keys.size(0), 1, 1, kpos.size(0)}) : keys;   // [B, 1, 1, Tk]
  if (alibi.defined()) {
    const at::Tensor bias = nn::alibi_bias_at(alibi, qpos, kpos, causal).unsqueeze(0);   // [1, H, Tq, Tk]
    return real.defined() ? bias.masked_fill(real.logical_not(), -INFINITY) : bias;
  }
  std::optional<at::Tensor> mask;
  if (causal) mask = kpos.unsqueeze(0).le(qpos.unsqueeze(1));   // [Tq, Tk], true = may attend
  if (real.defined()) mask = mask ? real.logical_and(*mask) : real;
  return mask;
}

SequenceMode parse_sequence_mode(const std::string& name) {
  if (name == "split_gather") return SequenceMode::split_gather;
  if (name == "ring") return SequenceMode::ring;
  if (name == "all_to_all") return SequenceMode::all_to_all;
  throw Error("unknown sequence mode \"" + name + "\" (expected split_gather, ring or all_to_all)");
}

SequenceLayout sequence_layout(SequenceMode mode, const dist::Group& group) {
  return SequenceLayout(group.size(), group.rank(), mode == SequenceMode::ring);
}

std::shared_ptr<nn::SequenceAttention> make_sequence_attention(SequenceMode mode, dist::Group& group) {
  switch (mode) {
    case SequenceMode::ring: return std::make_shared<RingAttention>(group);
    case SequenceMode::all_to_all: return std::make_shared<AllToAllAttention>(group);
    default: return std::make_shared<GatheredAttention>(group);
  }
}

}  // namespace colossal::parallel
