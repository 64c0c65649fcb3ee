// Self-attention: see attention.h.
#include "src/nn/attention.h"

#include <ATen/ATen.h>
#include <cmath>

#include "kernels/cpu/paged_attention.h"

#include "src/nn/alibi.h"
#include "src/nn/cached_attention.h"
#include "src/nn/cuda_decode_attention.h"
#include "src/nn/fused_attention.h"
#include "src/nn/kv_storage.h"
#include "src/nn/paged_attention_aten.h"
#include "src/nn/random_stream.h"
#include "src/nn/sequence_attention.h"

namespace colossal::nn {
namespace {

// Whether kernels/cpu/paged_attention's kernel takes kv for `rows` tokens of `heads` heads of d: pools on
// the CPU of an element it stores (float, half, bfloat16, int8 rows), each [blocks, heads, block_size,
// row width], and a position and a block table per token.
bool paged_kernel_takes(const LayerKv& kv, int64_t rows, int64_t heads, int64_t d) {
  const auto& r = *kv.paged;
  return kv_element_of(kv.k) && kv_holds_heads(kv, heads, d) && kv.k.size(2) == r.block_size &&
         static_cast<int64_t>(r.positions.size()) == rows && static_cast<int64_t>(r.tables.size()) == rows;
}

}  // namespace

Attention::Attention(const AttentionSpec& spec, LayerFactory& factory)
    : spec_(spec),
      heads_(factory.local_heads(spec.heads)),
      region_random_(factory.region_random()),
      sequence_(factory.sequence_attention()),
      mask_rows_(factory.attention_rows()),
      cut_(factory.stream_cut()) {
  if (spec.alibi) alibi_slopes_ = alibi_slopes(spec.heads).narrow(0, heads_.first, heads_.count).contiguous();   // each head its slope
  qkv_ = register_module(
      "qkv", factory.linear({.in = spec.width, .out = 3 * spec.width, .bias = spec.bias, .split = Split::Column, .parts = 3}));
  proj_ = register_module("proj", factory.linear({.in = spec.width, .out = spec.width, .bias = spec.bias, .split = Split::Row}));
}

at::Tensor Attention::forward(const at::Tensor& x, LayerKv* kv, int64_t offset, const at::Tensor& input_mask) {
  const at::Tensor mask = input_mask.defined() && mask_rows_ ? mask_rows_(input_mask) : input_mask;
  const double p = is_training() ? spec_.dropout : 0.0;
  const double p_attn = is_training() ? (spec_.attn_dropout < 0 ? spec_.dropout : spec_.attn_dropout) : 0.0;
  auto packed = qkv_->forward(x);                                                 // [B, T, 3C]
  // T from the projection: a layout that splits the block's tokens gathers them in it
  const int64_t b = x.size(0), t = packed.size(1), h = heads_.count, d = head_dim(), c = h * d;   // c: the local heads' width
  if (kv && kv->paged) return proj_->forward(paged_forward(packed, *kv));
  if (sequence_ && !kv) {   // this rank's part of the sequence, attending to every rank's
    // the only mask a split sequence takes: which keys of the whole sequence are real, [B, 1, 1, T]
    TORCH_CHECK(!mask.defined() || (mask.dim() == 4 && mask.size(1) == 1 && mask.size(2) == 1),
                "attention: a split sequence takes only a key padding mask [B, 1, 1, T]");
    TORCH_CHECK(p_attn == 0, "attention: a split sequence takes no attention dropout");
    const at::Tensor keys = mask.defined() ? mask.reshape({mask.size(0), mask.size(3)}).to(at::kBool) : at::Tensor();
    auto qkv = packed.view({b, t, 3, h, d}).permute({2, 0, 3, 1, 4});          // [3, B, H, T, D]
    const at::Tensor slopes = spec_.alibi ? alibi_slopes_.to(packed.device(), packed.scalar_type()) : at::Tensor();
    auto y = sequence_->attend(qkv[0], qkv[1], qkv[2], spec_.causal, slopes, keys).transpose(1, 2).reshape({b, t, c});   // [B, T, C]
    y = proj_->forward(y);
    return p > 0 ? cut_->dropout(y, p) : y;
  }
  if (spec_.alibi) {
    std::optional<at::Tensor> attended;   // a decoding step on the CPU: the fused step with the slopes; on a GPU over a narrow cache, its kernel
    if (kv && p_attn == 0)
      attended = chosen_decode_attention(packed, *kv, offset, h, mask, alibi_slopes_,
                                         [&] { alibi_forward(packed, kv, offset, mask, 0.0); });
    if (kv && p_attn == 0 && !attended && packed.is_cuda()) attended = cuda_decode_attention(packed, *kv, offset, h, mask, slopes_like(packed));
    auto y = proj_->forward(attended ? *attended : alibi_forward(packed, kv, offset, mask, p_attn));
    return p > 0 ? cut_->dropout(y, p) : y;
  }
  if (!kv && !mask.defined() && spec_.causal && p == 0 && p_attn == 0 && fused_attention_applies(packed) &&
      fused_attention_chosen(packed, h))
    return proj_->forward(fused_causal_attention(packed, h));   // short causal sequences on CPU
  if (kv) {
    TORCH_CHECK(spec_.causal && p == 0 && p_attn == 0, "attention: a KV cache is for causal generation without dropout");
    return proj_->forward(cached_attention(packed, *kv, offset, h, mask));
  }
  auto qkv = packed.view({b, t, 3, h, d}).permute({2, 0, 3, 1, 4});              // [3, B, H, T, D]
  std::optional<at::Tensor> attn_mask;   // an undefined tensor inside an optional still counts as a mask
  if (mask.defined()) attn_mask = mask;
  at::Tensor y = region_random_ && p_attn > 0   // this rank's heads draw their dropout from its own stream
                     ? attention_dropping(qkv[0], qkv[1], qkv[2], mask.defined() ? mask : at::Tensor(), spec_.causal && !mask.defined(), p_attn)
                     : at::scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], attn_mask, p_attn, spec_.causal && !mask.defined());
  y = y.transpose(1, 2).reshape({b, t, c});                                 // [B, T, C]
  y = proj_->forward(y);
  return p > 0 ? cut_->dropout(y, p) : y;
}

bool Attention::decode_parts(int64_t rows, const LayerKv& kv, int64_t offset, const at::Tensor& mask, DecodeParts& parts) {
  if (is_training() || !spec_.causal || sequence_ || heads_.count != spec_.heads || (mask.defined() && mask_rows_)) return false;
  if (kv.paged) {   // paged_forward's CPU kernel
    if (mask.defined() || !paged_kernel_takes(kv, rows, heads_.count, head_dim())) return false;
  } else if (!decode_cache_applies(rows, kv, offset, mask) || !kv_holds_heads(kv, heads_.count, head_dim()) ||
             // the policy, not the op's own timing (as LayerNorm::kernel_params)
             !decode_choice_.get(rows, [] { return std::optional<bool>(kernel_policy().attention != KernelPath::Aten); })) {
    return false;
  }
  parts.alibi_slopes = spec_.alibi ? alibi_slopes_.const_data_ptr<float>() : nullptr;
  auto qkv = qkv_->decode_product(rows), proj = proj_->decode_product(rows);
  if (!qkv || !proj || qkv->in != spec_.width || qkv->out != 3 * spec_.width || proj->in != spec_.width || proj->out != spec_.width)
    return false;
  parts.qkv = *qkv;
  parts.proj = *proj;
  return true;
}

at::Tensor Attention::attention_dropping(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                                         bool causal, double p) {
  // softmax(q k^T / sqrt(D) + mask) with dropout, then v: [B, H, T, D] x [B, H, S, D] -> [B, H, T, D]
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1)).mul_(1.0 / std::sqrt(static_cast<double>(q.size(-1))));   // [B, H, T, S]
  const int64_t t = q.size(2), s = k.size(2);
  if (causal) scores = scores.masked_fill(at::ones({t, s}, q.options().dtype(at::kBool)).triu(s - t + 1), -INFINITY);
  if (mask.defined()) scores = mask.scalar_type() == at::kBool ? scores.masked_fill(mask.logical_not(), -INFINITY) : scores + mask;
  at::Tensor probs = at::softmax(scores, -1);
  probs = probs * region_random_->keep_mask(probs.sizes(), p, probs.device()) * (1.0 / (1.0 - p));
  return at::matmul(probs, v);
}

at::Tensor Attention::paged_forward(const at::Tensor& packed_in, LayerKv& kv) {
  const auto& rows = *kv.paged;
  if (!packed_in.is_cpu() || packed_in.scalar_type() != at::kFloat)   // a GPU, or another dtype: ATen's
    return aten_paged_attention(packed_in, kv, heads_.count, spec_.alibi ? alibi_slopes_ : at::Tensor());
  const auto packed = packed_in.contiguous();
  const int64_t n = packed.size(0), c = packed.size(2) / 3, h = heads_.count, d = c / h;
  TORCH_CHECK(!is_training() && packed.size(1) == 1 && paged_kernel_takes(kv, n, h, d), "paged attention: rows ", packed.sizes(), " against a pool ", kv.k.sizes(), " (CPU float inference only)");
  auto y = at::empty({n, 1, c}, packed.options());
  const kernels::PagedAttentionDims dims{n, h, d, rows.block_size, static_cast<float>(1.0 / std::sqrt(static_cast<double>(d))),
                                        *kv_element_of(kv.k)};
  kernels::paged_attention(packed.const_data_ptr<float>(), kv.k.mutable_data_ptr(), kv.v.mutable_data_ptr(),
                           rows.positions.data(), rows.tables.data(), spec_.alibi ? alibi_slopes_.const_data_ptr<float>() : nullptr,
                           y.mutable_data_ptr<float>(), dims);
  return y;
}

const at::Tensor& Attention::slopes_like(const at::Tensor& packed) {
  if (!device_slopes_.defined() || device_slopes_.device() != packed.device() || device_slopes_.scalar_type() != packed.scalar_type())
    device_slopes_ = alibi_slopes_.to(packed.device(), packed.scalar_type());
  return device_slopes_;
}

at::Tensor Attention::alibi_forward(const at::Tensor& packed, LayerKv* kv, int64_t offset, const at::Tensor& mask, double p_attn) {
  const int64_t b = packed.size(0), t = packed.size(1), c = packed.size(2) / 3, h = heads_.count, d = c / h;
  auto parts = packed.view({b, t, 3, h, d}).permute({2, 0, 3, 1, 4});   // [3, B, H, T, D]
  at::Tensor k = parts[1], v = parts[2];
  if (kv) {
    write_keys_values(*kv, offset, k, v, mask);
    k = from_kv_storage(kv->k.narrow(2, 0, offset + t), packed.scalar_type());   // a narrower cache widened (kv_element.h)
    v = from_kv_storage(kv->v.narrow(2, 0, offset + t), packed.scalar_type());
  } else {
    offset = 0;
  }
  const at::Tensor& slopes = slopes_like(packed);
  // A captured step's query sits at the device-side slot (its mask is then given: write_keys_values checks).
  const at::Tensor queries = kv && kv->slot.defined() ? kv->slot : at::arange(offset, offset + t, slopes.options());
  const at::Tensor bias = alibi_bias(slopes, queries, offset + t, mask, spec_.causal);   // [1 or B, H, T, S]
  auto y = region_random_ && p_attn > 0 ? attention_dropping(parts[0], k, v, bias, false, p_attn)   // the rank's own stream
                                        : at::scaled_dot_product_attention(parts[0], k, v, bias, p_attn, false);   // [B, H, T, D]
  return y.transpose(1, 2).reshape({b, t, c});                                          // [B, T, C]
}

}  // namespace colossal::nn
