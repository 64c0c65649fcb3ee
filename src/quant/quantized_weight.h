// Quantizing a linear layer's fp32 weight [out, in] to the integers and scales of a QuantConfig, and back
// (qgemv.h gives the layouts). The round trip is what the decoding kernels compute with, so tests compare
// them against dequantize(), and the prefill multiplies by it.
#pragma once
#include <ATen/core/Tensor.h>

#include "src/quant/quant_config.h"

namespace colossal::quant {

struct QuantizedWeight {
  at::Tensor q;        // int8 [out, in], or uint8 [out, in / 2] (packed int4)
  at::Tensor scales;   // fp32 [out, in / group]
};

// Round to nearest (ties to even) of w / scale, scale = absmax of the group / 127 (int8) or / 7 (int4),
// clamped to the integer range; an all-zero group gets scale 0 and zeros. `w` is fp32 [out, in] with
// `in` checked by check_layer. On the CPU one pass over w (each row's groups: the absmax, then the
// integers), no temporaries: a model's tensors of hundreds of MB quantize at memory speed instead of
// paying the kernel's zeroing of five fresh temporaries each.
QuantizedWeight quantize_weight(const at::Tensor& w, const QuantConfig& c);
// The same in ATen operations, on any device: what the one pass is tested against, bit for bit.
QuantizedWeight quantize_weight_reference(const at::Tensor& w, const QuantConfig& c);
// fp32 [out, in]: q * scale of its group.
at::Tensor dequantize_weight(const at::Tensor& q, const at::Tensor& scales, const QuantConfig& c, int64_t in);
// The shapes a layer of `out` x `in` stores (the integers' dtype is at::kChar or at::kByte).
std::vector<int64_t> q_shape(const QuantConfig& c, int64_t out, int64_t in);
std::vector<int64_t> scales_shape(const QuantConfig& c, int64_t out, int64_t in);

// A weight-only layer's integers and scales repacked into the CPU quantized GEMM's panels
// (kernels/cpu/qgemm.h): q uint8 [tiles, bytes a tile], scales fp32 [tiles, groups x 16], tiles of 16
// output rows, the last padded with zero weights. And back to the layout above, exactly.
QuantizedWeight pack_for_qgemm(const QuantizedWeight& w, const QuantConfig& c, int64_t in);
QuantizedWeight unpack_from_qgemm(const QuantizedWeight& packed, const QuantConfig& c, int64_t in, int64_t out);

}  // namespace colossal::quant
