// Quantized linear layer and its factory: see quantized_linear.h.
#include "src/quant/quantized_linear.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/qgemm.h"
#include "kernels/cpu/qgemv.h"
#include "kernels/cuda/built.h"
#include "src/core/error.h"
#include "src/nn/linear_forward.h"
#include "src/quant/quantized_weight.h"
#if COLOSSAL_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "kernels/cuda/qgemv.h"
#endif

namespace colossal::quant {
namespace {

constexpr int64_t kQgemvMaxRows = 16;   // beyond this many rows the dequantized GEMM reads less per output

// x [..., 1, in] with at most kQgemvMaxRows rows: one new token of a few sequences (the decoding GEMV's shape).
bool decoding_rows(const at::Tensor& x, int64_t in) {
  return x.dim() >= 2 && x.size(-2) == 1 && x.size(-1) == in && x.numel() / in <= kQgemvMaxRows;
}

// At most kFewRows rows in all (a short prompt, or a step of more sequences than decoding_rows takes),
// where the CPU has no integer GEMM: the decoding GEMV takes them, x rounded as a decoding step rounds
// it (and as the integer GEMM rounds a prompt where it exists). The dequantizing GEMM splits rows among
// the threads, so a few rows ran on one core, and each thread dequantizes every weight as it packs it:
// on an AMD EPYC Zen 3 (AVX2, 2 threads) a 5-token prompt on an 8B int8 model took 9.4 s that way and
// 1.2 s through the GEMV, which streams the integers on both cores. On the 124M shape there the GEMV
// took 5 rows in 18 ms against 113, 14 in 37 against 120 (int8) and 190 (int4), and 40 in 105-120
// against 125-195: still ahead, but the GEMV's time grows with the rows and the GEMM's hardly, so the
// line is drawn below that.
constexpr int64_t kFewRows = 32;
bool few_rows(const at::Tensor& x, int64_t in) { return x.numel() > 0 && x.size(-1) == in && x.numel() / in <= kFewRows; }

}  // namespace

QuantizedLinear::QuantizedLinear(const nn::LinearSpec& spec, const QuantConfig& config, nn::ParamStorage storage)
    : config_(config), in_(spec.in), out_(spec.out) {
  check_layer(config, spec.in, "a linear layer of " + std::to_string(spec.in) + " x " + std::to_string(spec.out));
  const auto dtype = config.scheme == Scheme::int4_weight ? at::kByte : at::kChar;
  const bool deferred = storage == nn::ParamStorage::deferred;
  auto make = [&](at::IntArrayRef shape, at::ScalarType type, double fill) {
    return deferred ? nn::unallocated_tensor(shape, type) : at::full(shape, fill, at::TensorOptions().dtype(type));
  };
  qweight_ = register_parameter("qweight", make(q_shape(config, spec.out, spec.in), dtype, 0), /*requires_grad=*/false);
  scales_ = register_parameter("scales", make(scales_shape(config, spec.out, spec.in), at::kFloat, 0), /*requires_grad=*/false);
  if (spec.bias) bias_ = register_parameter("bias", make({spec.out}, at::kFloat, 0), /*requires_grad=*/false);
  if (config.scheme == Scheme::int8_smoothquant) smooth_ = register_parameter("smooth", make({spec.in}, at::kFloat, 1), /*requires_grad=*/false);
}

namespace {

// y [..., out] from f(x rows [M, in], M, y rows [M, out]) over x [..., in] as contiguous fp32 rows.
template <class F>
at::Tensor over_rows(const at::Tensor& x, int64_t in, int64_t out, const F& f) {
  const auto x2 = x.reshape({-1, in}).contiguous();
  auto y = at::empty({x2.size(0), out}, x.options());
  f(x2.const_data_ptr<float>(), x2.size(0), y.mutable_data_ptr<float>());
  auto sizes = x.sizes().vec();
  sizes.back() = out;
  return y.view(sizes);
}

// The integer kernels, which multiply by the stored integers directly: the decoding GEMV (qgemv.h) for
// a decoding step's rows, or where the CPU has AVX2 the prompt GEMM (qgemm.h) for a prompt's; both
// round x alike. Their signatures are the same, so one call serves both.
at::Tensor integer_kernel(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scales, const QuantConfig& c, int64_t in,
                          const at::Tensor& bias, bool prompt) {
  const int64_t out = q.size(0), group = c.group_for(in);
  const float* b = bias.defined() ? bias.const_data_ptr<float>() : nullptr;
  return over_rows(x, in, out, [&](const float* x2, int64_t rows, float* y) {
    if (c.scheme == Scheme::int4_weight)
      (prompt ? kernels::qgemm_int4 : kernels::qgemv_int4)(x2, rows, in, q.const_data_ptr<uint8_t>(), scales.const_data_ptr<float>(), group, b, y, out);
    else
      (prompt ? kernels::qgemm_int8 : kernels::qgemv_int8)(x2, rows, in, q.const_data_ptr<int8_t>(), scales.const_data_ptr<float>(), group, b, y, out);
  });
}

// The prefill elsewhere: our GEMM with the weight dequantized as its blocks are packed (gemm.h's GemmQuantizedB).
at::Tensor dequantizing_gemm(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scales, const QuantConfig& c, int64_t in,
                             const at::Tensor& bias) {
  const int64_t out = q.size(0);
  const kernels::GemmQuantizedB qb{q.const_data_ptr(), scales.const_data_ptr<float>(), c.group_for(in), c.scheme == Scheme::int4_weight};
  return over_rows(x, in, out, [&](const float* x2, int64_t rows, float* y) {
    kernels::GemmProblem p{.rows = rows, .cols = out, .depth = in, .a = x2, .a_row = in, .a_depth = 1, .b = nullptr, .b_depth = 1,
                           .b_col = in, .c = y, .ldc = out, .bias = bias.defined() ? bias.const_data_ptr<float>() : nullptr};
    p.quantized_b = &qb;
    kernels::gemm(p);
  });
}

bool cpu_inference(const at::Tensor& x, const at::Tensor& weight) {
  return x.is_cpu() && weight.is_cpu() && x.scalar_type() == at::kFloat && !at::GradMode::is_enabled();
}

// A decoding step's rows on a GPU, where nvcc built kernels/cuda/qgemv.cu and the layer is whole blocks
// of 32 inputs: the dp4a GEMV over the stored integers (any float x, computed in fp32).
bool cuda_decoding([[maybe_unused]] const at::Tensor& x, [[maybe_unused]] const at::Tensor& q,
                   [[maybe_unused]] const at::Tensor& scales, [[maybe_unused]] const QuantConfig& c, [[maybe_unused]] int64_t in) {
#if COLOSSAL_CUDA_KERNELS
  const auto aligned = [](const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.const_data_ptr()) % 16 == 0; };
  return x.is_cuda() && q.device() == x.device() && scales.device() == x.device() && at::isFloatingType(x.scalar_type()) &&
         !at::GradMode::is_enabled() && decoding_rows(x, in) && kernels::qgemv_cuda_takes(in, c.group_for(in)) && q.is_contiguous() &&
         scales.is_contiguous() && scales.scalar_type() == at::kFloat && aligned(q);
#else
  return false;
#endif
}

at::Tensor cuda_gemv([[maybe_unused]] const at::Tensor& x, [[maybe_unused]] const at::Tensor& q, [[maybe_unused]] const at::Tensor& scales,
                     [[maybe_unused]] const QuantConfig& c, [[maybe_unused]] int64_t in, [[maybe_unused]] const at::Tensor& bias) {
#if COLOSSAL_CUDA_KERNELS
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t out = q.size(0);
  // No copy where x is already contiguous fp32 (a decoding step is bound by launches on a GPU): the
  // kernel reads x one float a lane, and only its own int8 copy (xq) with 16-byte loads.
  const auto x2 = x.reshape({-1, in}).to(at::kFloat).contiguous();
  const int64_t rows = x2.size(0);
  const auto xq = at::empty({rows, in}, x2.options().dtype(at::kChar));
  const auto xs = at::empty({rows, in / kernels::kQ8Block}, x2.options());
  auto y = at::empty({rows, out}, x2.options());
  const auto b = bias.defined() ? bias.to(x2.options()).contiguous() : at::Tensor();
  kernels::qgemv_cuda(x2.const_data_ptr<float>(), rows, in, q.const_data_ptr(), c.scheme == Scheme::int4_weight, scales.const_data_ptr<float>(),
                      c.group_for(in), b.defined() ? b.const_data_ptr<float>() : nullptr, y.mutable_data_ptr<float>(), out,
                      xq.mutable_data_ptr<int8_t>(), xs.mutable_data_ptr<float>(), c10::cuda::getCurrentCUDAStream(x.get_device()).stream());
  auto sizes = x.sizes().vec();
  sizes.back() = out;
  return y.view(sizes).to(x.scalar_type());
#else
  throw Error("the quantized GEMV for CUDA was not built (no nvcc)");
#endif
}

}  // namespace

at::Tensor quantized_matmul(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scales, const QuantConfig& c, int64_t in,
                            const at::Tensor& bias) {
  const int64_t out = q.size(0);
  if (cuda_decoding(x, q, scales, c, in)) return cuda_gemv(x, q, scales, c, in, bias);
  const bool cpu_float = cpu_inference(x, q);
  if (cpu_float && decoding_rows(x, in)) return integer_kernel(x, q, scales, c, in, bias, /*prompt=*/false);
  if (cpu_float && x.numel() > 0 && kernels::qgemm_available(in, c.group_for(in))) return integer_kernel(x, q, scales, c, in, bias, /*prompt=*/true);
  if (cpu_float && few_rows(x, in)) return integer_kernel(x, q, scales, c, in, bias, /*prompt=*/false);
  const int64_t gemm_rows = out / kernels::kGemmColumnMultiple * kernels::kGemmColumnMultiple;
  if (cpu_float && gemm_rows == out && x.numel() > 0) return dequantizing_gemm(x, q, scales, c, in, bias);
  if (cpu_float && gemm_rows > 0 && x.numel() > 0) {
    // A row count the GEMM's columns cannot take whole (a vocabulary of 50257): the GEMM for all but the
    // last < 16 rows, those few dequantized, rather than the whole weight dequantized for every call.
    auto part = [&](const at::Tensor& t, int64_t from, int64_t n) { return t.defined() ? t.narrow(0, from, n) : t; };
    const int64_t rest = out - gemm_rows;
    const at::Tensor head = dequantizing_gemm(x, q.narrow(0, 0, gemm_rows), scales.narrow(0, 0, gemm_rows), c, in, part(bias, 0, gemm_rows));
    const at::Tensor tail = nn::linear_forward(x, dequantize_weight(q.narrow(0, gemm_rows, rest), scales.narrow(0, gemm_rows, rest), c, in),
                                               part(bias, gemm_rows, rest));
    return at::cat({head, tail}, -1);
  }
  // other devices, an empty x, or a gradient to record
  return nn::linear_forward(x, dequantize_weight(q, scales, c, in).to(x.device(), x.scalar_type()),
                            bias.defined() ? bias.to(x.device(), x.scalar_type()) : at::Tensor());
}

at::Tensor packed_matmul(const at::Tensor& x, const at::Tensor& panels, const at::Tensor& panel_scales, const QuantConfig& c, int64_t in,
                         int64_t out, const at::Tensor& bias) {
  if (x.numel() == 0) {
    auto sizes = x.sizes().vec();
    sizes.back() = out;
    return at::empty(sizes, x.options());
  }
  if (cpu_inference(x, panels))
    return over_rows(x, in, out, [&](const float* x2, int64_t rows, float* y) {
      kernels::qgemm_packed(x2, rows, in, panels.const_data_ptr<uint8_t>(), panel_scales.const_data_ptr<float>(),
                            c.scheme == Scheme::int4_weight, c.group_for(in), bias.defined() ? bias.const_data_ptr<float>() : nullptr, y, out);
    });
  // another device or a gradient to record: the checkpoint's layout again, for the paths above
  const QuantizedWeight w = unpack_from_qgemm({panels, panel_scales}, c, in, out);
  return quantized_matmul(x, w.q, w.scales, c, in, bias);
}

namespace {

// A layer's integers and scales replaced in place by the integer GEMM's panels, where the CPU has it
// and the layer suits it (the module's parameters are these same tensors). Returns whether it packed.
bool pack_in_place(at::Tensor& q, at::Tensor& scales, const QuantConfig& c, int64_t in) {
  if (!q.is_cpu() || !kernels::qgemm_available(in, c.group_for(in))) return false;
  const QuantizedWeight p = pack_for_qgemm({q, scales}, c, in);
  q.set_data(p.q);
  scales.set_data(p.scales);
  return true;
}

}  // namespace

bool QuantizedLinear::pack_for_cpu() {
  // SmoothQuant's layers too: their prompts take qgemm_w8a8 over the panels, their decoding rows the
  // packed GEMM as any int8 layer's (the GEMV's bits).
  if (packed_) return false;
  return packed_ = pack_in_place(qweight_, scales_, config_, in_);
}

// Whether ATen's int8 GEMM (_int_mm: cuBLASLt's int8 matmul with int32 sums on CUDA) takes x [..., in] on a
// GPU against this layer: more than 16 rows, in and out multiples of 8 (cuBLASLt's int8 layouts).
bool QuantizedLinear::int8_gemm_on_gpu(const at::Tensor& x) const {
  return x.is_cuda() && qweight_.device() == x.device() && x.numel() / in_ > 16 && in_ % 8 == 0 && out_ % 8 == 0;
}

// W8A8, a prompt's rows: x / s quantized to int8 per token (absmax / 127), an int8 GEMM summing in int32,
// then both scales and the bias. On the CPU qgemm_w8a8 does all of it in one kernel over the panels
// (packed once at load, or for this call where the layer kept its rows); on a GPU, ATen's ops and
// _int_mm (cuBLASLt). The two give the same bits. Not _int_mm on the CPU: without VNNI its oneDNN
// kernels add the byte products in int16 pairs that saturate (x + 128 times w), and a CPU capped to
// AVX2 put the tiny test models' prompt logits 5-10% of their spread off (ONEDNN_MAX_CPU_ISA=AVX2).
at::Tensor QuantizedLinear::smoothquant_gemm(const at::Tensor& x_in) const {
  if (x_in.is_cpu() && qweight_.is_cpu() && x_in.numel() > 0) {
    const QuantizedWeight panels = packed_ ? QuantizedWeight{qweight_, scales_} : pack_for_qgemm({qweight_, scales_}, config_, in_);
    const auto x = x_in.to(at::kFloat), smooth = smooth_.to(at::kFloat).contiguous();
    const auto bias = bias_.defined() ? bias_.to(at::kFloat).contiguous() : at::Tensor();
    return over_rows(x, in_, out_, [&](const float* x2, int64_t rows, float* y) {
             kernels::qgemm_w8a8(x2, smooth.const_data_ptr<float>(), rows, in_, panels.q.const_data_ptr<uint8_t>(),
                                 panels.scales.const_data_ptr<float>(), bias.defined() ? bias.const_data_ptr<float>() : nullptr, y, out_);
           })
        .to(x_in.scalar_type());
  }
  const at::Tensor xs = x_in / smooth_.to(x_in.device(), x_in.scalar_type());             // SmoothQuant's x / s
  auto x2 = xs.reshape({-1, in_}).to(at::kFloat);                                        // [M, in]
  const auto sx = x2.abs().amax(1, /*keepdim=*/true) / 127.0f;                           // [M, 1]
  const auto xq = (x2 / at::where(sx > 0, sx, at::ones_like(sx))).round_().clamp_(-127, 127).to(at::kChar);
  // (panels moved off the CPU: the rows' layout again)
  const QuantizedWeight w = packed_ ? unpack_from_qgemm({qweight_, scales_}, config_, in_, out_) : QuantizedWeight{qweight_, scales_};
  auto y = at::_int_mm(xq, w.q.t()).to(at::kFloat).mul_(sx).mul_(w.scales.view({1, -1}));   // [M, out]
  if (bias_.defined()) y.add_(bias_);
  auto sizes = xs.sizes().vec();
  sizes.back() = out_;
  return y.view(sizes);
}

std::optional<kernels::DecodeProduct> QuantizedLinear::decode_product(int64_t rows) {
  // What forward runs for decoding rows on the CPU: integer_kernel's GEMV, or for a packed layer the GEMM
  // over its panels (packed_matmul); SmoothQuant's x divided by s first.
  if (smooth_.defined() && (!smooth_.is_cpu() || !smooth_.is_contiguous() || smooth_.scalar_type() != at::kFloat)) return std::nullopt;
  if (at::GradMode::is_enabled() || !qweight_.is_cpu() || rows < 1 || rows > kQgemvMaxRows ||
      !qweight_.is_contiguous() || !scales_.is_contiguous() || (bias_.defined() && (!bias_.is_contiguous() || bias_.scalar_type() != at::kFloat)))
    return std::nullopt;
  using Kind = kernels::DecodeProduct::Kind;
  kernels::DecodeProduct p;
  p.group = config_.group_for(in_);
  const bool int4 = config_.scheme == Scheme::int4_weight;
  if (packed_) p.kind = int4 ? Kind::int4_panels : Kind::int8_panels;
  else p.kind = int4 ? Kind::int4_q8x : kernels::qgemv_integer_path(in_, p.group) ? Kind::int8_q8x : Kind::int8;
  p.w = qweight_.const_data_ptr();
  p.scales = scales_.const_data_ptr<float>();
  p.bias = bias_.defined() ? bias_.const_data_ptr<float>() : nullptr;
  p.in = in_;
  p.out = out_;
  p.divisor = smooth_.defined() ? smooth_.const_data_ptr<float>() : nullptr;
  if (!kernels::decode_product_supported(p)) return std::nullopt;
  return p;
}

at::Tensor QuantizedLinear::forward(const at::Tensor& x_in) {
  auto weight_only = [&](const at::Tensor& x) {
    return packed_ ? packed_matmul(x, qweight_, scales_, config_, in_, out_, bias_) : quantized_matmul(x, qweight_, scales_, config_, in_, bias_);
  };
  if (!smooth_.defined()) return weight_only(x_in);
  if (!decoding_rows(x_in, in_) && !at::GradMode::is_enabled() && (x_in.is_cpu() || int8_gemm_on_gpu(x_in))) return smoothquant_gemm(x_in);
  return weight_only(x_in / smooth_.to(x_in.device(), x_in.scalar_type()));   // SmoothQuant's x / s, then the int8 layer's kernel
}

QuantizedEmbedding::QuantizedEmbedding(int64_t num, int64_t dim) : num_(num), dim_(dim) {
  qweight_ = register_parameter("qweight", at::zeros({num, dim}, at::kChar), /*requires_grad=*/false);
  scales_ = register_parameter("scales", at::zeros({num, 1}), /*requires_grad=*/false);
}

at::Tensor QuantizedEmbedding::forward(const at::Tensor& ids) {
  const auto flat = ids.reshape({-1});
  at::Tensor rows;   // [N, dim]
  if (packed_ && flat.is_cpu()) {   // read from the panels
    const auto i64 = flat.to(at::kLong).contiguous();
    const int64_t* id = i64.const_data_ptr<int64_t>();
    for (int64_t i = 0; i < i64.numel(); ++i)
      if (id[i] < 0 || id[i] >= num_)
        throw Error("token id " + std::to_string(id[i]) + " is outside the vocabulary of " + std::to_string(num_) + " rows");
    rows = at::empty({i64.numel(), dim_});
    kernels::qgemm_packed_rows(qweight_.const_data_ptr<uint8_t>(), scales_.const_data_ptr<float>(), false, dim_, dim_, id, i64.numel(),
                               rows.mutable_data_ptr<float>());
  } else {   // the rows' layout (moved off the CPU after packing: read back first)
    const QuantizedWeight w = packed_ ? unpack_from_qgemm({qweight_, scales_}, config(), dim_, num_) : QuantizedWeight{qweight_, scales_};
    rows = w.q.index_select(0, flat).to(at::kFloat).mul_(w.scales.index_select(0, flat));
  }
  auto sizes = ids.sizes().vec();
  sizes.push_back(dim_);
  return rows.view(sizes);
}

at::Tensor QuantizedEmbedding::project(const at::Tensor& x) {
  return packed_ ? packed_matmul(x, qweight_, scales_, config(), dim_, num_, {}) : quantized_matmul(x, qweight_, scales_, config(), dim_, {});
}

bool QuantizedEmbedding::pack_for_cpu() { return !packed_ && (packed_ = pack_in_place(qweight_, scales_, config(), dim_)); }

std::shared_ptr<nn::Linear> QuantizedLayerFactory::linear(const nn::LinearSpec& spec) {
  ++layers_;
  auto layer = std::make_shared<QuantizedLinear>(spec, config_, storage());
  built_layers_.push_back(layer);
  return layer;
}

std::shared_ptr<nn::Embedding> QuantizedLayerFactory::embedding(int64_t num, int64_t dim, nn::Split split) {
  if (split != nn::Split::Vocab || !config_.embedding) return LayerFactory::embedding(num, dim, split);   // positions: small
  ++embeddings_;
  auto e = std::make_shared<QuantizedEmbedding>(num, dim);
  built_embeddings_.push_back(e);
  return e;
}

int64_t QuantizedLayerFactory::pack_for_cpu() {
  int64_t packed = 0;
  for (const auto& w : built_layers_)
    if (auto l = w.lock()) packed += l->pack_for_cpu();
  for (const auto& w : built_embeddings_)
    if (auto e = w.lock()) packed += e->pack_for_cpu();
  return packed;
}

}  // namespace colossal::quant
