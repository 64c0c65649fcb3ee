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
  int64_t eval_tokens = -1;          // tokens scored (at most); 0: no perplexity; -1: 16384, or 2048 streamed
                                     // (each streamed pass of 4 windows reads the model from the disk)
  std::string calib;                 // int8-smoothquant's calibration text (.txt) or dataset (.h5, its training
                                     // split); "": the start of the embedded corpus
  int64_t calib_tokens = 8192;
  // A --kv-cache kind (fp32, fp16, bf16, int8) or "": the quantized model's perplexity also through a KV
  // cache that stores it (keys and values written and read back as generation would), so the cost of
  // quantized weights and a narrow cache shows together.
  std::string kv_cache;
  // "on": block at a time. The source is read one tensor at a time, quantized and written out at once,
  // and the perplexity and calibration passes stream the blocks from the disk (StreamedWeights), so a
  // model larger than memory quantizes in about two blocks' memory. "off": the whole model in memory.
  // "auto": on when both models would take more than half of what this process may hold.
  std::string stream_weights = "auto";
  std::string stream_cache = "/var/tmp";   // the streamed passes' cache file where a layout is not read in place
  uint64_t max_shard_bytes = 5000000000;   // save_pretrained's default: model-0000k-of-0000N beyond it
};

struct QuantizeReport {
  std::string out;
  int64_t layers = 0;                  // linear layers quantized
  bool embedding = false;              // the token embedding (the tied head) as int8 rows
  int64_t bytes_before = 0, bytes_after = 0;   // the weights' bytes as stored
  std::string eval_source;             // what the perplexity was measured on
  int64_t eval_tokens = 0;             // tokens scored
  double ppl_before = 0, ppl_after = 0;
  double ppl_kv = 0;                   // ppl_after through options.kv_cache's cache (0: not measured)
  std::string calib_source;            // int8-smoothquant: what calibrated it
  int64_t calib_tokens = 0;
  bool streamed = false;               // block at a time (stream_weights)
  int64_t files = 1;                   // safetensors files written
};

// Without `eval`, the held-out split of the dataset the checkpoint's recipe trained on, when both are
// there, else the embedded corpus (data/kjv/kjv.txt). Error (one line) on a non-causal-LM model, an
// unknown scheme or a group size some layer cannot take (naming the layer's width). Both ways of working
// (stream_weights) write the same files.
QuantizeReport quantize_checkpoint(const QuantizeOptions& options);

}  // namespace colossal
