// Tiny decoder models of each family quantized for tests (tests/test_quant.cpp on the CPU, tests/test_cuda_quant.cpp
// on a GPU): the fp32 model, its quantized copy and an fp32 model holding the quantized weights' round trip.
#pragma once
#include <memory>
#include <string>

#include "models/registry.h"
#include "src/nn/causal_lm.h"
#include "src/quant/quant_config.h"

namespace colossal::test {

// GPT, OPT or BLOOM: 2 blocks 64 wide, 2 heads, 32 positions, the test tokenizer's 512 pieces.
ModelConfig tiny_family(const std::string& family);

struct QuantizedPair {
  std::shared_ptr<nn::CausalLM> fp32, quantized, dequantized;   // the last: fp32 layers holding the round trip's weights
};

// Seeded (24) fp32 weights quantized with `c` (SmoothQuant calibrated on random ids first); all three in
// eval mode on the CPU.
// `pack`: the quantized model's layers then hold the integer GEMM's panels where this CPU has it
// (QuantizedLinear::pack_for_cpu, as an inference process packs them).
QuantizedPair quantized_pair(const std::string& family, const quant::QuantConfig& c, bool pack = false);

// Logits [B, T, V] of a prefill of ids' first 8 positions, then one position at a time through a KV cache
// (each a decoding step), on ids' device.
at::Tensor prefill_then_decode(nn::CausalLM& model, const at::Tensor& ids);

}  // namespace colossal::test
