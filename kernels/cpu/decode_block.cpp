// A pre-norm block's decoding step in one parallel region: see decode_block.h.
#include "kernels/cpu/decode_block.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <omp.h>
#include <vector>

#include "kernels/cpu/decode_attention.h"
#include "kernels/cpu/isa_kernels.h"
#include "kernels/cpu/paged_attention.h"
#include "kernels/cpu/qgemm.h"
#include "kernels/cpu/qgemv.h"
#include "kernels/cpu/quantized_rows.h"
#include "kernels/cpu/stretches.h"
#include "kernels/cpu/thread_scratch.h"

namespace colossal::kernels {
namespace {

using Kind = DecodeProduct::Kind;

std::atomic<uint64_t> g_steps{0};

bool quantizes_x(const DecodeProduct& p) { return p.kind != Kind::f32 && p.kind != Kind::f32_t && p.kind != Kind::int8; }

RowsFor rows_for(const DecodeProduct& p) {
  return p.kind == Kind::int8_panels ? RowsFor::int8_panels : p.kind == Kind::int4_panels ? RowsFor::int4_panels : RowsFor::gemv;
}

// A product's input: the float rows, and where the product takes them quantized, their int8 blocks
// (quantize_rows' buffers of the one thread that quantized them, read by all until that thread's next
// quantization, a stage later at the earliest).
struct Input {
  const float* x = nullptr;
  const QuantizedRows* q = nullptr;
};

// Outputs [o_begin, o_end) of product p for every row.
void product_range(const IsaKernels& k, const DecodeProduct& p, const Input& in, int64_t rows, float* y, int64_t o_begin, int64_t o_end) {
  switch (p.kind) {
    case Kind::f32:
      k.gemv(in.x, rows, p.in, static_cast<const float*>(p.w), p.bias, y, p.out, o_begin, o_end);
      break;
    case Kind::f32_t:
      k.gemv_t(in.x, rows, p.in, static_cast<const float*>(p.w), p.out, p.bias, y, p.out, o_begin, o_end);
      break;
    case Kind::int8:
      k.qgemv_int8(in.x, rows, p.in, static_cast<const int8_t*>(p.w), p.scales, p.group, p.bias, y, p.out, o_begin, o_end);
      break;
    case Kind::int8_q8x:
      k.qgemv_q8x_int8(in.q->q.data(), in.q->a.data(), in.q->s.data(), in.q->c.data(), rows, p.in, static_cast<const int8_t*>(p.w),
                       p.scales, p.group, p.bias, y, p.out, o_begin, o_end);
      break;
    case Kind::int4_q8x:
      k.qgemv_q8x_int4(in.q->q.data(), in.q->a.data(), in.q->s.data(), in.q->c.data(), rows, p.in, static_cast<const uint8_t*>(p.w),
                       p.scales, p.group, p.bias, y, p.out, o_begin, o_end);
      break;
    case Kind::int8_panels:
    case Kind::int4_panels: {   // qgemm_packed's tiles for these outputs (32-output groups: pairs of whole tiles)
      QgemmProblem q{in.q->q.data(), in.q->s.data(), in.q->sum.data(), rows, p.in, nullptr, p.kind == Kind::int4_panels, nullptr,
                     p.group, p.bias, y, p.out, static_cast<const uint8_t*>(p.w), p.scales};
      set_problem_rows(q, *in.q);   // the split or the step's layout, where the set reads them
      // the thread's scratch: with 16 rows (serving 16 sequences) the amx set multiplies them in its tiles
      k.qgemm_columns(q, o_begin, o_end, qgemm_thread_scratch(p.in, p.group));
      break;
    }
  }
}

// A product's outputs in groups, the items its threads share: 16 outputs, as row_groups.h; over packed
// panels, 32, so that every piece but a product's last is two whole tiles, which the VNNI loop takes
// together (qgemm_isa.cpp; single tiles were 8% of an 8-sequence int4 step).
int64_t group_outputs(const DecodeProduct& p) { return p.kind == Kind::int8_panels || p.kind == Kind::int4_panels ? 32 : 16; }
int64_t groups_of(const DecodeProduct& p) { return (p.out + group_outputs(p) - 1) / group_outputs(p); }

// Product p's output groups shared among the region's threads (stretches.h), then `after(o_begin,
// o_end)` on each piece (the stage's elementwise tail, on outputs this thread has just written). Ends
// with the threads' barrier.
template <class After>
void shared_product(const IsaKernels& k, Stretches& share, const DecodeProduct& p, const Input& in, int64_t rows, float* y,
                    const After& after) {
  share.work(omp_get_thread_num(), [&](int64_t g_begin, int64_t g_end) {
    const int64_t b = g_begin * group_outputs(p), e = std::min(p.out, g_end * group_outputs(p));
    product_range(k, p, in, rows, y, b, e);
    after(b, e);
  });
#pragma omp barrier
}

// The attention stage inside the region: decode_attention.h's tasks over the cache, or paged_attention.h's
// (every token's key and value written first by one thread: a chunk's later tokens read its earlier
// ones), shared out by `share`.
void attention_stage(const DecodeBlockStep& s, const float* qkv, float* attended, Stretches& share) {
  const PagedAttentionDims paged{s.rows, s.heads, s.head_dim, s.block_size, s.scale, s.kv_element};
  const DecodeAttentionDims cached{s.rows, s.heads, s.head_dim, s.capacity, s.length, s.scale, s.alibi_slopes, s.kv_element};
  if (s.tables) {
#pragma omp single
    paged_write_keys_values(qkv, s.k_cache, s.v_cache, s.positions, s.tables, paged);
  }
  float* scores = thread_scratch(static_cast<size_t>(s.tables ? paged_longest(s.positions, s.rows) : s.length));
  share.work(omp_get_thread_num(), [&](int64_t t_begin, int64_t t_end) {
    for (int64_t task = t_begin; task < t_end; ++task) {
      if (s.tables) paged_attention_task(qkv, s.k_cache, s.v_cache, s.positions, s.tables, s.alibi_slopes, attended, paged, task, scores);
      else decode_attention_task(qkv, s.k_cache, s.v_cache, s.valid, s.valid_stride, attended, cached, task, scores);
    }
  });
}

// The block's buffers, kept by the calling thread across steps (every layer of every step comes here).
struct Buffers {
  std::vector<float> normed, qkv, attended, h, pre, hidden, stats, divided;
  Input input;
  Stretches qkv_share, heads_share, proj_share, fc_share, fc2_share;
};

}  // namespace

bool decode_product_supported(const DecodeProduct& p) {
  if (!p.w || p.in <= 0 || p.out <= 0) return false;
  if (p.kind == Kind::f32 || p.kind == Kind::f32_t) return true;
  if (!p.scales || p.group <= 0 || p.in % p.group != 0) return false;
  if (p.kind == Kind::int8) return true;
  if ((p.kind == Kind::int8_panels || p.kind == Kind::int4_panels) && !active_kernels().qgemm_columns) return false;
  return qgemv_integer_path(p.in, p.group);
}

uint64_t decode_block_steps() { return g_steps.load(std::memory_order_relaxed); }

void decode_block_step(const DecodeBlockStep& s) {
  g_steps.fetch_add(1, std::memory_order_relaxed);
  const auto& k = active_kernels();
  const int64_t rows = s.rows, c = s.width, tasks = s.rows * s.heads;
  thread_local Buffers kept;
  Buffers& buf = kept;   // the calling thread's: inside the region, `kept` would name each thread's own
  // Each buffer starts on a cache line: the fp32 GEMVs and the attention load x and q 64 bytes at a time,
  // and from std::vector's 16-byte start every such load spanned two lines (an 8-row fp32 pass over a
  // 768-input layer in L2 ran at 0.63x the rate it has from aligned rows).
  auto fit = [](std::vector<float>& v, int64_t n) { return aligned_floats(v, static_cast<size_t>(n)); };
  float* normed = fit(buf.normed, rows * c);
  float* qkv = fit(buf.qkv, rows * 3 * c);
  float* attended = fit(buf.attended, rows * c);
  float* h = fit(buf.h, rows * c);
  float* pre = fit(buf.pre, rows * s.hidden);   // the MLP's first product, then `hidden` its activation
  float* hidden = fit(buf.hidden, rows * s.hidden);
  float* stats = fit(buf.stats, 2 * rows);
  // x / s of a SmoothQuant product (sized here: the products' stages only read and write it)
  float* divided = fit(buf.divided, rows * std::max({s.qkv.in, s.proj.in, s.fc.in, s.fc2.in}));
  Input& input = buf.input;

  // One thread's serial stretch: LayerNorm (kernels/cpu/layer_norm.cpp's blocks of 32 rows) and, for a
  // product over quantized x, the rows' int8 blocks.
  auto norm = [&](const float* x, const float* gamma, const float* beta, float eps) {
    for (int64_t r = 0; r < rows; r += 32) {
      const int64_t n = std::min<int64_t>(32, rows - r);
      k.layer_norm_forward(x + r * c, gamma, beta, normed + r * c, stats + r, stats + rows + r, n, c, eps);
    }
  };
  auto feed = [&](const float* x, const DecodeProduct& p) {
    if (p.divisor) {   // the division the layer's forward does (IEEE's, so the same bits)
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < p.in; ++i) divided[r * p.in + i] = x[r * p.in + i] / p.divisor[i];
      x = divided;
    }
    input.x = x;
    input.q = quantizes_x(p) ? &quantize_rows(k, x, rows, p.in, rows_for(p)) : nullptr;
  };
  auto nothing = [](int64_t, int64_t) {};
  const int threads = omp_get_max_threads();
  buf.qkv_share.reset(groups_of(s.qkv), threads);
  buf.heads_share.reset(tasks, threads);
  buf.proj_share.reset(groups_of(s.proj), threads);
  buf.fc_share.reset(groups_of(s.fc), threads);
  buf.fc2_share.reset(groups_of(s.fc2), threads);

#pragma omp parallel num_threads(threads)
  {
#pragma omp single
    {
      norm(s.x, s.ln1_gamma, s.ln1_beta, s.ln1_eps);
      feed(normed, s.qkv);
    }
    shared_product(k, buf.qkv_share, s.qkv, input, rows, qkv, nothing);

    attention_stage(s, qkv, attended, buf.heads_share);
#pragma omp barrier

#pragma omp single
    feed(attended, s.proj);
    float* y = s.out;   // the projection's output, then the residual stream h = x + y
    shared_product(k, buf.proj_share, s.proj, input, rows, y, [&](int64_t b, int64_t e) {
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t o = b; o < e; ++o) h[r * c + o] = s.x[r * c + o] + y[r * c + o];
    });

#pragma omp single
    {
      norm(h, s.ln2_gamma, s.ln2_beta, s.ln2_eps);
      feed(normed, s.fc);
    }
    shared_product(k, buf.fc_share, s.fc, input, rows, pre, [&](int64_t b, int64_t e) {
      for (int64_t r = 0; r < rows; ++r) {
        const float* u = pre + r * s.hidden;
        float* v = hidden + r * s.hidden;
        if (s.act == DecodeActivation::gelu_tanh) k.gelu_tanh_forward(u + b, v + b, e - b);
        else
          for (int64_t o = b; o < e; ++o) v[o] = u[o] < 0.0f ? 0.0f : u[o];   // ATen's relu, NaN aside
      }
    });

#pragma omp single
    feed(hidden, s.fc2);
    shared_product(k, buf.fc2_share, s.fc2, input, rows, s.out, [&](int64_t b, int64_t e) {
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t o = b; o < e; ++o) s.out[r * c + o] = h[r * c + o] + s.out[r * c + o];
    });
  }
}

}  // namespace colossal::kernels
