// `colossal quantize`: an fp32 (or bf16/fp16) causal-LM checkpoint or Hugging Face directory in, a
// quantized model directory out (quant_config.h: int8 or int4 weights with fp32 scales, written as
// safetensors under the source's tensor names plus ".qweight" / ".scales", config.json carrying
// quantization_config), and the cost in perplexity: both models are run over the same held-out windows.
#pragma once
#include <cstdint>
#include <string>

#include "src/quant/quant_config.h"

namespace colossal {

struct QuantizeOptions {
  std::string input;                 // checkpoint, run or model directory (resolve_checkpoint)
  std::string out;                   // the quantized model directory
  quant::QuantConfig config;
  std::string eval;                  // held-out text (.txt) or token dataset (.h5, its val split); "": see below
  int64_t eval_tokens = 16384;       // tokens scored (at most); 0: no perplexity
  std::string calib;                 // int8-smoothquant's calibration text (.txt) or dataset (.h5, its training
                                     // split); "": the start of the embedded corpus
  int64_t calib_tokens = 8192;
};

struct QuantizeReport {
  std::string out;
  int64_t layers = 0;                  // linear layers quantized
  bool embedding = false;              // the token embedding (the tied head) as int8 rows
  int64_t bytes_before = 0, bytes_after = 0;   // the weights' bytes as stored
  std::string eval_source;             // what the perplexity was measured on
  int64_t eval_tokens = 0;             // tokens scored
  double ppl_before = 0, ppl_after = 0;
  std::string calib_source;            // int8-smoothquant: what calibrated it
  int64_t calib_tokens = 0;
};

// Without `eval`, the held-out split of the dataset the checkpoint's recipe trained on, when both are
// there, else the embedded corpus (data/kjv/kjv.txt). Error (one line) on a non-causal-LM model, an
// unknown scheme or a group size some layer cannot take (naming the layer's width).
QuantizeReport quantize_checkpoint(const QuantizeOptions& options);

}  // namespace colossal
