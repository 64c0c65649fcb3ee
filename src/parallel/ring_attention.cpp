// Ring attention (see sequence_attention.h): keys and values travel around the sequence-parallel ring
// one rank's chunks a step, and each rank folds every block of its queries against them into its
// output with the online softmax of blockwise attention (a running log-sum-exp per query), so no rank
// ever holds more than two ranks' keys and values. Forward sends the next block while this one is
// computed. Backward recomputes each block's probabilities from the saved log-sum-exp and sends the
// keys and values around again together with their gradients, which after a full turn arrive complete
// at the rank that owns them.
//
// Each block runs ATen's flash-attention kernel on the CPU (forward gives the block's log-sum-exp,
// backward takes the whole output's), so a block's memory grows with its length, not its square.
//
// Blocks are sub-chunks: under a causal mask a block of query chunk a against key chunk b is skipped
// when b > a, masked on its diagonal when b == a, and whole when b < a (chunk indices are positions in
// the sequence), so the zigzag layout's ranks each compute the same number of blocks. An encoder's
// padding masks each block's keys by a bias built from the whole sequence's real keys (masks are small).
#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "src/dist/group.h"
#include "src/nn/alibi.h"
#include "src/parallel/sequence_attention.h"

namespace colossal::parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

enum class Block { skip, diagonal, whole };

Block block_kind(int64_t query_chunk, int64_t key_chunk, bool causal) {
  if (!causal || key_chunk < query_chunk) return Block::whole;
  return key_chunk == query_chunk ? Block::diagonal : Block::skip;
}

// One block's attention and its log-sum-exp per query: [B, H, c, D] and [B, H, c]. On the CPU ATen's
// flash kernel, which tiles the block (memory O(c), not O(c^2)); elsewhere the scores whole.
// `bias`: ALiBi's [1, H, c, c] for this block (its diagonal's future -inf), or undefined.
std::pair<at::Tensor, at::Tensor> block_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, Block kind, double scale,
                                                const at::Tensor& bias);
// The block's share of dq, dk and dv from the whole output's gradient, output and log-sum-exp.
std::tuple<at::Tensor, at::Tensor, at::Tensor> block_backward(const at::Tensor& d_o, const at::Tensor& q, const at::Tensor& k,
                                                              const at::Tensor& v, const at::Tensor& o, const at::Tensor& lse,
                                                              const at::Tensor& delta, Block kind, double scale, const at::Tensor& bias);

// A padding key's score: finite, so a row that sees no real key in some block gets a log-sum-exp the
// merge then weighs at zero rather than a NaN (every row has a real key somewhere in the sequence).
constexpr double kPaddingScore = -1e30;

// The float bias of query chunk qc against key chunk kc, chunks of c positions: ALiBi's distances
// (`slopes`, with a diagonal block's future at -inf) and the padding of `keys` [B, T] (real: true), or
// undefined when neither applies. [B or 1, H or 1, c, c]; `like` gives its dtype and device.
at::Tensor block_bias(const at::Tensor& slopes, const at::Tensor& keys, int64_t qc, int64_t kc, int64_t c, Block kind, const at::Tensor& like) {
  at::Tensor bias;
  if (slopes.defined()) {
    const auto opts = at::TensorOptions(at::kLong).device(slopes.device());
    bias = nn::alibi_bias_at(slopes, at::arange(qc * c, qc * c + c, opts), at::arange(kc * c, kc * c + c, opts), kind == Block::diagonal)
               .unsqueeze(0);   // [1, H, c, c]
  }
  if (!keys.defined()) return bias;
  const int64_t b = keys.size(0);
  const at::Tensor padded = keys.narrow(1, kc * c, c).logical_not().view({b, 1, 1, c});
  const at::Tensor pad = at::zeros({b, 1, 1, c}, like.options()).masked_fill_(padded, kPaddingScore);
  if (!bias.defined() && kind == Block::diagonal)   // a bias replaces the kernel's causal flag: the future in it
    bias = at::zeros({c, c}, like.options()).masked_fill_(at::ones({c, c}, like.options().dtype(at::kBool)).triu(1), -INFINITY).view({1, 1, c, c});
  return bias.defined() ? bias + pad : pad;
}

// Scores of a block [B, H, c, c] with the diagonal block's future masked.
at::Tensor block_scores(const at::Tensor& q, const at::Tensor& k, Block kind, double scale) {
  at::Tensor s = at::matmul(q, k.transpose(-2, -1)).mul_(scale);
  if (kind == Block::diagonal) {
    const int64_t c = q.size(2);
    s.masked_fill_(at::ones({c, c}, q.options().dtype(at::kBool)).triu(1), -INFINITY);
  }
  return s;
}

// fp32 on the CPU; other dtypes and devices take the scores whole (the tests run that path in double).
bool flash(const at::Tensor& q) { return q.is_cpu() && q.scalar_type() == at::kFloat; }

std::pair<at::Tensor, at::Tensor> block_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, Block kind, double scale,
                                                const at::Tensor& bias) {
  const std::optional<at::Tensor> mask = bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt;
  if (flash(q)) {
    auto [out, lse] = at::_scaled_dot_product_flash_attention_for_cpu(q.contiguous(), k.contiguous(), v.contiguous(), 0.0,
                                                                      kind == Block::diagonal && !mask, mask, scale);
    return {out, lse};
  }
  at::Tensor sc = block_scores(q, k, kind, scale);   // [B, H, c, c]
  if (mask) sc = sc + *mask;
  const at::Tensor lse = at::logsumexp(sc, -1);           // finite: every row sees a key
  return {at::matmul(at::exp(sc - lse.unsqueeze(-1)), v), lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> block_backward(const at::Tensor& d_o, const at::Tensor& q, const at::Tensor& k,
                                                              const at::Tensor& v, const at::Tensor& o, const at::Tensor& lse,
                                                              const at::Tensor& delta, Block kind, double scale, const at::Tensor& bias) {
  const std::optional<at::Tensor> mask = bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt;
  if (flash(q)) {   // the kernel takes rowsum(dO * O) from the whole output it is given
    auto [dq, dk, dv] = at::_scaled_dot_product_flash_attention_for_cpu_backward(d_o.contiguous(), q.contiguous(), k.contiguous(),
                                                                                 v.contiguous(), o.contiguous(), lse.contiguous(), 0.0,
                                                                                 kind == Block::diagonal && !mask, mask, scale);
    return {dq, dk, dv};
  }
  at::Tensor sc = block_scores(q, k, kind, scale);
  if (mask) sc = sc + *mask;
  const at::Tensor p = at::exp(sc - lse.unsqueeze(-1));   // [B, H, c, c]
  const at::Tensor ds = p * (at::matmul(d_o, v.transpose(-2, -1)) - delta.unsqueeze(-1));
  return {at::matmul(ds, k).mul_(scale), at::matmul(ds.transpose(-2, -1), q).mul_(scale), at::matmul(p.transpose(-2, -1), d_o)};
}

struct RingAttentionFn : public torch::autograd::Function<RingAttentionFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor* alibi,
                            const at::Tensor* real_keys, bool causal, const SequenceLayout* layout, dist::Group* g) {
    const at::Tensor slopes = *alibi, keys = *real_keys;   // not autograd inputs: an undefined one has no place there
    const int64_t s = g->size(), r = g->rank();
    const auto mine = layout->chunks_of(r);
    const int64_t m = static_cast<int64_t>(mine.size()), c = q.size(2) / m;
    const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
    at::Tensor o = at::zeros_like(q);
    at::Tensor lse = at::full({q.size(0), q.size(1), q.size(2)}, -INFINITY, q.options());   // [B, H, Tq]
    at::Tensor kv = at::stack({k, v}).contiguous(), next = at::empty_like(kv);            // [2, B, H, Tq, D]
    for (int64_t step = 0; step < s; ++step) {
      const int64_t src = ((r - step) % s + s) % s;
      dist::Pending sending;
      if (step + 1 < s) sending = g->ring_shift_async(kv, next, "ring attention keys and values");
      const auto theirs = layout->chunks_of(src);
      for (int64_t qi = 0; qi < m; ++qi) {
        const at::Tensor qs = q.narrow(2, qi * c, c);
        at::Tensor o_q = o.narrow(2, qi * c, c), lse_q = lse.narrow(2, qi * c, c);
        for (int64_t ki = 0; ki < m; ++ki) {
          const Block kind = block_kind(mine[static_cast<size_t>(qi)], theirs[static_cast<size_t>(ki)], causal);
          if (kind == Block::skip) continue;
          const at::Tensor bias = block_bias(slopes, keys, mine[static_cast<size_t>(qi)], theirs[static_cast<size_t>(ki)], c, kind, q);
          const auto [out, block_lse] = block_forward(qs, kv[0].narrow(2, ki * c, c), kv[1].narrow(2, ki * c, c), kind, scale, bias);
          const at::Tensor merged = at::logaddexp(lse_q, block_lse);
          o_q.mul_(at::exp(lse_q - merged).unsqueeze(-1)).add_(out * at::exp(block_lse - merged).unsqueeze(-1));
          lse_q.copy_(merged);
        }
      }
      if (sending.active()) {
        g->wait(sending);
        std::swap(kv, next);
      }
    }
    ctx->save_for_backward({q, k, v, o, lse});
    if (slopes.defined()) ctx->saved_data["slopes"] = slopes;
    if (keys.defined()) ctx->saved_data["keys"] = keys;
    ctx->saved_data["causal"] = causal;
    ctx->saved_data["layout"] = reinterpret_cast<int64_t>(layout);
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(g);
    return o;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &o = saved[3], &lse = saved[4];
    const at::Tensor slopes = ctx->saved_data.count("slopes") ? ctx->saved_data["slopes"].toTensor() : at::Tensor();
    const at::Tensor keys = ctx->saved_data.count("keys") ? ctx->saved_data["keys"].toTensor() : at::Tensor();
    const bool causal = ctx->saved_data["causal"].toBool();
    const auto* layout = reinterpret_cast<const SequenceLayout*>(ctx->saved_data["layout"].toInt());
    auto* g = reinterpret_cast<dist::Group*>(ctx->saved_data["group"].toInt());
    const at::Tensor d_o = grad[0].contiguous();
    const int64_t s = g->size(), r = g->rank();
    const auto mine = layout->chunks_of(r);
    const int64_t m = static_cast<int64_t>(mine.size()), c = q.size(2) / m;
    const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
    // [B, H, Tq]: rowsum(dO * O), softmax's backward term, for the whole-scores path (the flash kernel
    // takes it from the output it is given)
    const at::Tensor delta = flash(q) ? at::Tensor() : (d_o * o).sum(-1);
    at::Tensor dq = at::zeros_like(q);
    // [k, v, dk, dv] of the chunk held now; the gradients ride along and come home after a full turn.
    at::Tensor buf = at::stack({k, v, at::zeros_like(k), at::zeros_like(v)}).contiguous(), next = at::empty_like(buf);
    for (int64_t step = 0; step < s; ++step) {
      const int64_t src = ((r - step) % s + s) % s;
      const auto theirs = layout->chunks_of(src);
      for (int64_t qi = 0; qi < m; ++qi) {
        const at::Tensor qs = q.narrow(2, qi * c, c), do_q = d_o.narrow(2, qi * c, c), o_q = o.narrow(2, qi * c, c);
        const at::Tensor lse_q = lse.narrow(2, qi * c, c), delta_q = delta.defined() ? delta.narrow(2, qi * c, c) : delta;
        at::Tensor dq_q = dq.narrow(2, qi * c, c);
        for (int64_t ki = 0; ki < m; ++ki) {
          const Block kind = block_kind(mine[static_cast<size_t>(qi)], theirs[static_cast<size_t>(ki)], causal);
          if (kind == Block::skip) continue;
          const at::Tensor bias = block_bias(slopes, keys, mine[static_cast<size_t>(qi)], theirs[static_cast<size_t>(ki)], c, kind, q);
          const auto [dq_b, dk_b, dv_b] = block_backward(do_q, qs, buf[0].narrow(2, ki * c, c), buf[1].narrow(2, ki * c, c), o_q, lse_q,
                                                         delta_q, kind, scale, bias);
          dq_q.add_(dq_b);
          buf[2].narrow(2, ki * c, c).add_(dk_b);
          buf[3].narrow(2, ki * c, c).add_(dv_b);
        }
      }
      if (s == 1) break;
      // After the last step only the gradients still travel, home to their owner.
      const bool last = step + 1 == s;
      const at::Tensor out = last ? buf.narrow(0, 2, 2) : buf, in = last ? next.narrow(0, 2, 2) : next;
      dist::Pending p = g->ring_shift_async(out, in, last ? "ring attention key and value gradients" : "ring attention backward");
      g->wait(p);
      std::swap(buf, next);
    }
    return {dq, buf[2].clone(), buf[3].clone(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal, const SequenceLayout& layout,
                          dist::Group& group, const at::Tensor& alibi, const at::Tensor& keys) {
  return RingAttentionFn::apply(q.contiguous(), k.contiguous(), v.contiguous(), &alibi, &keys, causal, &layout, &group);
}

}  // namespace colossal::parallel
