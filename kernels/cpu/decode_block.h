// One pre-norm transformer block's decoding step on CPU (one new token for each of a few sequences) in a
// single OpenMP parallel region: LayerNorm, the QKV product, attention against the KV cache, the output
// projection and its residual, LayerNorm, the MLP's two products with the activation between them and
// their residual. Run op by op, the step opened five parallel regions and paid ATen's dispatch,
// allocation and a serial stretch between each, where the second core waited: on a 2-core AMD EPYC Zen 3
// the worker thread sat idle for 14% of an fp32 step and 20% of an int4 one. Here the threads share every
// product's outputs and every attention head, and meet at a barrier between stages.
//
// Each stage runs the same instruction-set loops as the op-by-op path (gemv.h, qgemv.h, decode_attention.h,
// layer_norm.h, gelu.h), whose results do not depend on how outputs are shared among threads, so a block
// step here gives the op-by-op path's bits.
//
// Layouts (row-major float): x and out [rows, width]; the caches as decode_attention.h lays them out, or
// the block pools of paged_attention.h.
#pragma once
#include <cstdint>

#include "kernels/cpu/kv_element.h"

namespace colossal::kernels {

// A product y = x W^T + b as the decoding GEMVs take it.
struct DecodeProduct {
  enum class Kind : uint8_t {
    f32,        // w: float [out][in]
    f32_t,      // w: float [in][out] (W stored transposed; gemv.h's gemv_t)
    int8,       // w: int8 [out][in] with `scales`, x as it is (qgemv.h's float path)
    int8_q8x,   // the same over x quantized per block of 32 (qgemv.h's integer path)
    int4_q8x,   // w: packed int4 [out][in / 2] (qgemv.h's layout), over quantized x
    // w: the integer GEMM's panels and `scales` its panel scales (qgemm.h, packed at load where the CPU
    // has it), int8 or int4, over quantized x: a packed layer's own kernel, the same bits as its forward
    int8_panels,
    int4_panels,
  };
  Kind kind = Kind::f32;
  const void* w = nullptr;
  const float* scales = nullptr;   // [out][in / group] for the integer kinds
  int64_t group = 0;
  const float* bias = nullptr;     // [out] or null
  int64_t in = 0, out = 0;
  const float* divisor = nullptr;  // [in] or null: x / divisor first (SmoothQuant's s), as the layer divides
};

enum class DecodeActivation : uint8_t { gelu_tanh, relu };

struct DecodeBlockStep {
  int64_t rows = 0;                 // sequences, one token each (at most 32)
  int64_t width = 0, hidden = 0;    // the stream's and the MLP's features
  int64_t heads = 0, head_dim = 0;  // heads * head_dim == width
  const float* x = nullptr;         // [rows, width]
  float* out = nullptr;             // [rows, width]
  const float *ln1_gamma = nullptr, *ln1_beta = nullptr, *ln2_gamma = nullptr, *ln2_beta = nullptr;
  float ln1_eps = 1e-5f, ln2_eps = 1e-5f;
  DecodeProduct qkv, proj, fc, fc2;   // qkv.out == 3 * width, q | k | v
  DecodeActivation act = DecodeActivation::gelu_tanh;
  void *k_cache = nullptr, *v_cache = nullptr;    // [rows, heads, capacity, head_dim]; paged: the block pools
  KvElement kv_element = KvElement::f32;          // what they store (kv_element.h)
  int64_t capacity = 0;
  int64_t length = 0;                 // positions attended, the new one (written at length - 1) included
  const uint8_t* valid = nullptr;     // [rows, valid_stride] or null (decode_attention.h)
  int64_t valid_stride = 0;
  float scale = 0;                    // usually 1 / sqrt(head_dim)
  // Paged (serving, paged_attention.h) where `tables` is given: row i is a token at positions[i] of the
  // sequence whose block table is tables[i], in pools [num_blocks, heads, block_size, head_dim]; rows of
  // one prompt chunk see each other. capacity, length and valid unused.
  const int64_t* positions = nullptr;
  const int32_t* const* tables = nullptr;
  int64_t block_size = 0;
  const float* alibi_slopes = nullptr;   // ALiBi's slopes [heads] (BLOOM), over the cache or the blocks; or null
};

// Whether a product of this shape and kind can run here (the integer kinds need whole blocks of 32 inputs).
bool decode_product_supported(const DecodeProduct& p);

void decode_block_step(const DecodeBlockStep& step);

// Block steps run here so far in this process (tests check that a model's decoding takes this path).
uint64_t decode_block_steps();

}  // namespace colossal::kernels
