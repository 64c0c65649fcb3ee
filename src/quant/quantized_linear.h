// QuantizedLinear: a linear layer whose weight is stored quantized (quant_config.h), for inference.
// Parameters: "qweight" (int8 [out, in] or packed int4 uint8 [out, in / 2]), "scales" (fp32
// [out, in / group]), "bias", and for int8-smoothquant "smooth" (fp32 [in], x is divided by it); none
// records a gradient. Decoding rows (x [B, 1, in], B <= 16) go through kernels/cpu/qgemv's integer dot
// products; longer inputs (the prefill) go through the integer GEMM where the CPU has AVX2
// (kernels/cpu/qgemm.h), elsewhere through kernels/cpu/gemm with the weight dequantized block by
// block as the GEMM packs it (never a whole fp32 copy), or under SmoothQuant through an int8 GEMM with x
// quantized per token (on the CPU our qgemm_w8a8, over panels packed at load or per call; on a GPU
// ATen's _int_mm, with its bits). A process
// that only runs inference on such a CPU repacks the weights once into the integer GEMM's panels
// (pack_for_cpu), and then every call, a decoding step's too, takes it.
// On a GPU (where nvcc built kernels/cuda), decoding rows take kernels/cuda/qgemv.h's dp4a GEMV, the CPU
// integer path's arithmetic; SmoothQuant's prompts take ATen's int8 GEMM (cuBLASLt); other prompts
// multiply by the weight dequantized for the call.
//
// QuantizedLayerFactory builds models whose every linear layer is one of these, so `colossal infer`
// and `serve` load a quantized checkpoint into the same model classes as an fp32 one.
#pragma once
#include <memory>
#include <vector>

#include "src/nn/factory.h"
#include "src/quant/quant_config.h"

namespace colossal::quant {

class QuantizedLinear : public nn::Linear {
 public:
  // Error when `in` cannot take the config's groups (check_layer). Deferred: the tensors have shapes
  // and types but no memory (a streamed model's blocks, filled as each runs).
  QuantizedLinear(const nn::LinearSpec& spec, const QuantConfig& config, nn::ParamStorage storage = nn::ParamStorage::allocated);
  at::Tensor forward(const at::Tensor& x) override;   // [..., in] -> [..., out]
  at::Tensor& weight() override { return qweight_; }  // the integers (packed: the panels)
  // Where this CPU has the integer GEMM and the layer suits it (int8 or int4, whole blocks of 32):
  // "qweight" and "scales" become qgemm.h's panels ([tiles, bytes a tile], [tiles, groups x 16]), in
  // place, and the GEMM serves every CPU call without packing. For a process that runs inference
  // only: a checkpoint saved afterwards would hold the panels. Returns whether it packed.
  bool pack_for_cpu();
  bool packed() const { return packed_; }
  // The product forward(x) runs for decoding rows on the CPU, for the fused decoding block: the GEMV
  // (qgemv.h) of an unpacked weight-only layer, or the integer GEMM over a packed layer's panels.
  std::optional<kernels::DecodeProduct> decode_product(int64_t rows) override;

 private:
  at::Tensor smoothquant_gemm(const at::Tensor& x) const;   // a prompt's rows, x before its division by s
  bool int8_gemm_on_gpu(const at::Tensor& x) const;
  QuantConfig config_;
  int64_t in_ = 0, out_ = 0;
  bool packed_ = false;
  at::Tensor qweight_, scales_, bias_;
  at::Tensor smooth_;   // int8-smoothquant: x is divided by it (s per input channel)
};

// The token embedding of a quantized model, which the tied LM head reads too: int8 rows with one fp32
// scale a row ("qweight", "scales"; whatever the linear layers' scheme, as llama.cpp keeps its output
// layer at a higher precision than the blocks). A lookup dequantizes its rows; project() (the head) runs
// the quantized GEMV or GEMM, so decoding reads a quarter of the fp32 head's bytes.
class QuantizedEmbedding : public nn::Embedding {
 public:
  QuantizedEmbedding(int64_t num, int64_t dim);
  at::Tensor forward(const at::Tensor& ids) override;   // [...] -> [..., dim] fp32
  at::Tensor& weight() override { return qweight_; }    // the integers
  at::Tensor project(const at::Tensor& x) override;     // [..., dim] -> [..., num]
  c10::ScalarType output_dtype() override { return at::kFloat; }
  static QuantConfig config() { return {Scheme::int8_weight, 0}; }
  bool pack_for_cpu();   // as QuantizedLinear's; lookups then read the panels
  bool packed() const { return packed_; }

 private:
  at::Tensor qweight_, scales_;
  int64_t num_ = 0, dim_ = 0;
  bool packed_ = false;
};

// y = x dequant(W)^T + bias for a weight-only layout (int8, int4) on the CPU: the decoding GEMV for up
// to 16 rows of one token; for more, the integer GEMM where the CPU has AVX2, else the fp32 GEMM
// dequantizing as it packs; ATen over the dequantized weight elsewhere.
at::Tensor quantized_matmul(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scales, const QuantConfig& c, int64_t in,
                            const at::Tensor& bias);
// The same with the weight in qgemm.h's panels (pack_for_qgemm) of a layer `out` x `in`.
at::Tensor packed_matmul(const at::Tensor& x, const at::Tensor& panels, const at::Tensor& panel_scales, const QuantConfig& c, int64_t in,
                         int64_t out, const at::Tensor& bias);

class QuantizedLayerFactory : public nn::LayerFactory {
 public:
  // Deferred storage: the linear layers' tensors have no memory until given (a streamed model's blocks).
  explicit QuantizedLayerFactory(QuantConfig config, nn::ParamStorage storage = nn::ParamStorage::allocated)
      : nn::LayerFactory(storage), config_(config) {}
  std::shared_ptr<nn::Linear> linear(const nn::LinearSpec& spec) override;
  // The vocabulary embedding (the tied head) quantized to int8 rows; other embeddings stay fp32.
  std::shared_ptr<nn::Embedding> embedding(int64_t num, int64_t dim, nn::Split split) override;
  int64_t layers() const { return layers_; }           // linear layers built so far
  int64_t embeddings() const { return embeddings_; }   // quantized (vocabulary) embeddings built so far
  // pack_for_cpu on every layer and embedding built so far that is still alive (after their weights
  // were loaded); returns how many packed.
  int64_t pack_for_cpu();

 private:
  QuantConfig config_;
  int64_t layers_ = 0, embeddings_ = 0;
  std::vector<std::weak_ptr<QuantizedLinear>> built_layers_;
  std::vector<std::weak_ptr<QuantizedEmbedding>> built_embeddings_;
};

}  // namespace colossal::quant
