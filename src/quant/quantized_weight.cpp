// Weight quantization and its inverse: see quantized_weight.h.
#include "src/quant/quantized_weight.h"

#include <ATen/ATen.h>

#include "kernels/cpu/qgemm.h"
#include "kernels/cpu/qgemv.h"

namespace colossal::quant {

std::vector<int64_t> q_shape(const QuantConfig& c, int64_t out, int64_t in) {
  return {out, c.scheme == Scheme::int4_weight ? in / 2 : in};
}

std::vector<int64_t> scales_shape(const QuantConfig& c, int64_t out, int64_t in) { return {out, in / c.group_for(in)}; }

QuantizedWeight quantize_weight(const at::Tensor& w, const QuantConfig& c) {
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
