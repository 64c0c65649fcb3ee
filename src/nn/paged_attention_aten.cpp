// Paged attention on ATen alone: see paged_attention_aten.h.
#include "src/nn/paged_attention_aten.h"

#include <ATen/ATen.h>
#include <algorithm>
#include <limits>
#include <map>
#include <vector>

#include "src/nn/kv_storage.h"

namespace colossal::nn {

// The step's indices, the same for every layer: built on the host and sent to the device in one
// transfer (each .to() of a pageable tensor waits for the GPU), then views of it.
struct PagedGather {
  c10::Device device = c10::Device(c10::kCPU);
  int64_t sequences = 0, keys = 0, width = 0;   // S; L, the longest sequence; W, the most rows of one
  at::Tensor write_block, write_slot;   // [N]: each row's key and value slot
  at::Tensor read_block, read_slot;     // [S, L]: each sequence's keys (past its length, its first block's)
  at::Tensor query_row;                 // [S * W]: the row of each sequence's place (padding: row 0)
  at::Tensor query_position;            // [S, 1, W, 1]: its position (padding: 0, so it sees key 0 alone)
  at::Tensor place;                     // [N]: each row's place in the padded [S * W]
};

namespace {

std::shared_ptr<const PagedGather> gather_for(const PagedRows& rows, const c10::Device& device) {
  const auto n = static_cast<int64_t>(rows.positions.size());
  const int64_t bs = rows.block_size;
  // The step's sequences, in order of their first row: a row's sequence and its place among its rows.
  std::map<const int32_t*, int64_t> sequence_of;
  std::vector<const int32_t*> tables;
  std::vector<int64_t> length, count, row_sequence(static_cast<size_t>(n)), row_place(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const auto [it, fresh] = sequence_of.try_emplace(rows.tables[static_cast<size_t>(i)], static_cast<int64_t>(tables.size()));
    if (fresh) {
      tables.push_back(it->first);
      length.push_back(0);
      count.push_back(0);
    }
    const auto s = static_cast<size_t>(it->second);
    row_sequence[static_cast<size_t>(i)] = it->second;
    row_place[static_cast<size_t>(i)] = count[s]++;
    length[s] = std::max(length[s], rows.positions[static_cast<size_t>(i)] + 1);
  }
  auto g = std::make_shared<PagedGather>();
  g->device = device;
  g->sequences = static_cast<int64_t>(tables.size());
  g->keys = *std::max_element(length.begin(), length.end());
  g->width = *std::max_element(count.begin(), count.end());
  const int64_t s_n = g->sequences, l_n = g->keys, w_n = g->width;

  // One host buffer: write_block, write_slot [N]; read_block, read_slot [S * L]; query_row,
  // query_position [S * W]; place [N].
  std::vector<int64_t> all(static_cast<size_t>(3 * n + 2 * s_n * l_n + 2 * s_n * w_n), 0);
  int64_t* write_block = all.data();
  int64_t* write_slot = write_block + n;
  int64_t* read_block = write_slot + n;
  int64_t* read_slot = read_block + s_n * l_n;
  int64_t* query_row = read_slot + s_n * l_n;
  int64_t* query_position = query_row + s_n * w_n;
  int64_t* place = query_position + s_n * w_n;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t p = rows.positions[static_cast<size_t>(i)];
    write_block[i] = rows.tables[static_cast<size_t>(i)][p / bs];
    write_slot[i] = p % bs;
    place[i] = row_sequence[static_cast<size_t>(i)] * w_n + row_place[static_cast<size_t>(i)];
    query_row[place[i]] = i;
    query_position[place[i]] = p;
  }
  for (int64_t s = 0; s < s_n; ++s)
    for (int64_t j = 0; j < l_n; ++j) {
      read_block[s * l_n + j] = tables[static_cast<size_t>(s)][j < length[static_cast<size_t>(s)] ? j / bs : 0];
      read_slot[s * l_n + j] = j % bs;
    }
  const at::Tensor d = at::tensor(all, at::kLong).to(device);
  int64_t offset = 0;
  auto next = [&](int64_t numel, c10::IntArrayRef shape) {
    at::Tensor t = d.narrow(0, offset, numel).view(shape);
    offset += numel;
    return t;
  };
  g->write_block = next(n, {n});
  g->write_slot = next(n, {n});
  g->read_block = next(s_n * l_n, {s_n, l_n});
  g->read_slot = next(s_n * l_n, {s_n, l_n});
  g->query_row = next(s_n * w_n, {s_n * w_n});
  g->query_position = next(s_n * w_n, {s_n, 1, w_n, 1});
  g->place = next(n, {n});
  return g;
}

}  // namespace

at::Tensor aten_paged_attention(const at::Tensor& packed_in, LayerKv& kv, int64_t heads, const at::Tensor& alibi_slopes) {
  using at::indexing::Slice;
  const PagedRows& rows = *kv.paged;
  const at::Tensor packed = packed_in.contiguous();
  const int64_t n = packed.size(0), c = packed.size(2) / 3, h = heads, d = c / h;
  TORCH_CHECK(packed.dim() == 3 && packed.size(1) == 1 && n > 0 && static_cast<int64_t>(rows.positions.size()) == n &&
                  static_cast<int64_t>(rows.tables.size()) == n && kv.k.size(1) == h && kv.k.size(2) == rows.block_size &&
                  kv.k.size(3) == kv_row_width(d, kv.k.scalar_type()) && kv.k.device() == packed.device(),
              "paged attention: rows ", packed.sizes(), " ", packed.scalar_type(), " against a pool ", kv.k.sizes(), " ",
              kv.k.scalar_type(), " on ", kv.k.device());
  const c10::Device device = packed.device();
  if (!rows.gather || rows.gather->device != device) rows.gather = gather_for(rows, device);
  const PagedGather& g = *rows.gather;

  // 1. Every row's key and value into its slot (before any row reads: a chunk's rows see each other).
  const at::Tensor qkv = packed.view({n, 3, h, d});
  // A pool narrower than the compute dtype (kv_element.h) takes them rounded, and gives them back widened.
  const auto stored = kv.k.scalar_type(), computed = packed.scalar_type();
  kv.k.index_put_({g.write_block, Slice(), g.write_slot}, to_kv_storage(qkv.select(1, 1), stored));   // [N, H, D] into [blocks, H, bs, D]
  kv.v.index_put_({g.write_block, Slice(), g.write_slot}, to_kv_storage(qkv.select(1, 2), stored));

  // 2. Each sequence's keys and values [S, H, L, D], and its rows' queries [S, H, W, D].
  const at::Tensor k = from_kv_storage(kv.k.index({g.read_block, Slice(), g.read_slot}).permute({0, 2, 1, 3}), computed);   // from [S, L, H, D]
  const at::Tensor v = from_kv_storage(kv.v.index({g.read_block, Slice(), g.read_slot}).permute({0, 2, 1, 3}), computed);
  const at::Tensor q = qkv.select(1, 0).index_select(0, g.query_row).view({g.sequences, g.width, h, d}).permute({0, 2, 1, 3});

  // 3. Each query sees the keys at or before its position; ALiBi adds slope * (j - position).
  const at::Tensor key_positions = at::arange(g.keys, at::TensorOptions().dtype(at::kLong).device(device)).view({1, 1, 1, g.keys});
  const at::Tensor allowed = key_positions <= g.query_position;   // [S, 1, W, L]
  at::Tensor mask = allowed;
  if (alibi_slopes.defined()) {   // [S, H, W, L]
    const at::Tensor slopes = alibi_slopes.to(device, at::kFloat).view({1, h, 1, 1});
    mask = (slopes * (key_positions - g.query_position).to(at::kFloat))
               .masked_fill(allowed.logical_not(), -std::numeric_limits<float>::infinity())
               .to(packed.scalar_type());
  }
  const at::Tensor y = at::scaled_dot_product_attention(q, k, v, mask);   // [S, H, W, D]

  // 4. Back to the rows' order.
  return y.permute({0, 2, 1, 3}).reshape({g.sequences * g.width, c}).index_select(0, g.place).view({n, 1, c});
}

}  // namespace colossal::nn
