// Weight quantization and its inverse: see quantized_weight.h.
#include "src/quant/quantized_weight.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/qgemm.h"
#include "kernels/cpu/qgemv.h"

namespace colossal::quant {

std::vector<int64_t> q_shape(const QuantConfig& c, int64_t out, int64_t in) {
  return {out, c.scheme == Scheme::int4_weight ? in / 2 : in};
}

std::vector<int64_t> scales_shape(const QuantConfig& c, int64_t out, int64_t in) { return {out, in / c.group_for(in)}; }

QuantizedWeight quantize_weight(const at::Tensor& w_in, const QuantConfig& c) {
  if (!w_in.is_cpu()) return quantize_weight_reference(w_in, c);
  const int64_t out = w_in.size(0), in = w_in.size(1), g = c.group_for(in), groups = in / g;
  // GPT-2's Conv1D weights come as transposed views of the file (read_model_state's views): read in place,
  // sixteen output rows at a time (one cache line of each stored row), not copied into rows first.
  const bool columns = w_in.scalar_type() == at::kFloat && w_in.stride(0) == 1 && w_in.stride(1) == out && out > 1;
  const at::Tensor w = columns ? w_in : w_in.to(at::kFloat).contiguous();
  const bool int4 = c.scheme == Scheme::int4_weight;
  const float top = int4 ? 7.0f : 127.0f, lo = int4 ? -8.0f : -127.0f;
  QuantizedWeight r{at::empty(q_shape(c, out, in), int4 ? at::kByte : at::kChar), at::empty({out, groups}, at::kFloat)};
  const float* src = w.const_data_ptr<float>();
  float* scales = r.scales.mutable_data_ptr<float>();
  uint8_t* q = static_cast<uint8_t*>(r.q.mutable_data_ptr());
  // Row o's group k: its scale from the group's absmax, and its integers n = round(x / scale) clamped, as
  // the reference's float operations compute them. Rounding is to nearest, ties to even (at::round):
  // |x / safe| <= 127 here, and adding 1.5 * 2^23 puts it where floats are whole numbers, so the addition
  // rounds it as nearbyint would and taking the constant away again is exact; unlike a call to nearbyint
  // (this file is built for the baseline ISA, without SSE4.1's roundps), the loops vectorise.
  constexpr float kWhole = 12582912.0f;
  auto safe_scale = [&](int64_t o, int64_t k, float absmax) {
    const float scale = absmax / top;
    scales[o * groups + k] = scale;
    return scale > 0.0f ? scale : 1.0f;
  };
  auto level = [&](float x, float safe) { return std::clamp((x / safe + kWhole) - kWhole, lo, top); };
  constexpr int64_t half = kernels::kInt4Block / 2;
  auto emit = [&](int64_t o, int64_t k, const float* n) {   // row o's group k of integers, stored
    if (!int4) {
      int8_t* row = reinterpret_cast<int8_t*>(q) + o * in + k * g;
      for (int64_t i = 0; i < g; ++i) row[i] = static_cast<int8_t>(n[i]);
      return;
    }
    uint8_t* row = q + o * (in / 2) + k * (g / 2);   // block b's byte j: input j low, input j + 16 high
    for (int64_t b = 0; b < g / kernels::kInt4Block; ++b)
      for (int64_t j = 0; j < half; ++j) {
        const float* v = n + b * kernels::kInt4Block + j;
        row[b * half + j] = static_cast<uint8_t>(static_cast<int>(v[0] + 8.0f) | (static_cast<int>(v[half] + 8.0f) << 4));
      }
  };
  constexpr int64_t kRows = 16;
  at::parallel_for(0, columns ? (out + kRows - 1) / kRows : out, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> n(static_cast<size_t>(columns ? kRows * g : g));
    for (int64_t t = begin; t < end; ++t)
      for (int64_t k = 0; k < groups; ++k) {
        if (!columns) {
          const float* x = src + t * in + k * g;
          float m[8] = {};   // eight chains: the max's latency, not its count, bounds a single one
          for (int64_t i = 0; i + 8 <= g; i += 8)
            for (int l = 0; l < 8; ++l) m[l] = std::max(m[l], std::fabs(x[i + l]));
          const float safe = safe_scale(t, k, *std::max_element(m, m + 8));   // g is a multiple of 32
          for (int64_t i = 0; i < g; ++i) n[static_cast<size_t>(i)] = level(x[i], safe);
          emit(t, k, n.data());
          continue;
        }
        const int64_t o0 = t * kRows, rows = std::min(kRows, out - o0);
        const float* x = src + k * g * out + o0;   // input k * g + i of row o0 + l at x[i * out + l]
        float m[kRows] = {}, safe[kRows];
        for (int64_t i = 0; i < g; ++i)
          for (int64_t l = 0; l < rows; ++l) m[l] = std::max(m[l], std::fabs(x[i * out + l]));
        for (int64_t l = 0; l < rows; ++l) safe[l] = safe_scale(o0 + l, k, m[l]);
        for (int64_t i = 0; i < g; ++i)
          for (int64_t l = 0; l < rows; ++l) n[static_cast<size_t>(l * g + i)] = level(x[i * out + l], safe[l]);
        for (int64_t l = 0; l < rows; ++l) emit(o0 + l, k, n.data() + l * g);
      }
  });
  return r;
}

QuantizedWeight quantize_weight_reference(const at::Tensor& w, const QuantConfig& c) {
  const int64_t out = w.size(0), in = w.size(1), g = c.group_for(in);
  const double top = c.scheme == Scheme::int4_weight ? 7.0 : 127.0;
  auto groups = w.to(at::kFloat).contiguous().view({out, in / g, g});       // [out, G, g]
  auto scales = groups.abs().amax(-1) / top;                                // [out, G]
  auto safe = at::where(scales > 0, scales, at::ones_like(scales));
  auto n = at::round(groups / safe.unsqueeze(-1));
  if (c.scheme != Scheme::int4_weight) return {n.clamp(-127, 127).to(at::kChar).view({out, in}).contiguous(), scales};
  // int4: value + 8 in 0..15; block b's byte j = input j (low nibble) | input j + 16 (high nibble)
  auto u = (n.clamp(-8, 7) + 8).to(at::kByte).view({out, in / kernels::kInt4Block, 2, kernels::kInt4Block / 2});
  auto packed = at::bitwise_or(u.select(2, 0), at::bitwise_left_shift(u.select(2, 1), 4));   // [out, blocks, 16]
  return {packed.reshape({out, in / 2}).contiguous(), scales};
}

at::Tensor dequantize_weight(const at::Tensor& q, const at::Tensor& scales, const QuantConfig& c, int64_t in) {
  const int64_t out = q.size(0), g = c.group_for(in);
  at::Tensor values;   // [out, in] float
  if (c.scheme != Scheme::int4_weight) {
    values = q.to(at::kFloat);
  } else {
    auto b = q.view({out, in / kernels::kInt4Block, kernels::kInt4Block / 2});
    auto lo = at::bitwise_and(b, 15), hi = at::bitwise_right_shift(b, 4);
    values = at::stack({lo, hi}, 2).to(at::kFloat).sub_(8).view({out, in});   // [out, blocks, 2, 16] -> [out, in]
  }
  return (values.view({out, in / g, g}) * scales.unsqueeze(-1)).view({out, in});
}

QuantizedWeight pack_for_qgemm(const QuantizedWeight& w, const QuantConfig& c, int64_t in) {
  const bool int4 = c.scheme == Scheme::int4_weight;
  const int64_t out = w.q.size(0), group = c.group_for(in), tiles = (out + kernels::kQgemmColumns - 1) / kernels::kQgemmColumns;
  const auto q = w.q.contiguous();
  const auto scales = w.scales.contiguous();
  const int64_t tile = kernels::kQgemmColumns;   // one tile's sizes
  QuantizedWeight p{at::empty({tiles, kernels::qgemm_packed_bytes(in, tile, int4)}, at::kByte),
                    at::empty({tiles, kernels::qgemm_packed_scales(in, tile, group)}, at::kFloat)};
  kernels::qgemm_pack(q.const_data_ptr(), scales.const_data_ptr<float>(), int4, group, in, out, p.q.mutable_data_ptr<uint8_t>(),
                      p.scales.mutable_data_ptr<float>());
  return p;
}

QuantizedWeight unpack_from_qgemm(const QuantizedWeight& packed, const QuantConfig& c, int64_t in, int64_t out) {
  const bool int4 = c.scheme == Scheme::int4_weight;
  QuantizedWeight w{at::empty(q_shape(c, out, in), int4 ? at::kByte : at::kChar), at::empty(scales_shape(c, out, in), at::kFloat)};
  const auto panels = packed.q.cpu().contiguous();
  const auto scales = packed.scales.cpu().contiguous();
  kernels::qgemm_unpack(panels.const_data_ptr<uint8_t>(), scales.const_data_ptr<float>(), int4, c.group_for(in), in, out,
                        w.q.mutable_data_ptr(), w.scales.mutable_data_ptr<float>());
  return {w.q.to(packed.q.device()), w.scales.to(packed.q.device())};
}

}  // namespace colossal::quant
