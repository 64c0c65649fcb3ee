// Train-run test helpers: see train_runs.h.
#include "tests/support/train_runs.h"

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>

#include "src/io/hf_weights.h"

namespace colossal::test {

// A 2-layer width-32 GPT on the shared small corpus. Dropout 0 and pinned kernels, so that runs differ
// only in how the batch is split across ranks. AdamW's eps is 1e-5: the attention key bias has a gradient
// that is zero in exact arithmetic (softmax ignores a constant added to every key), so what it gets is
// rounding noise, which Adam with eps 1e-8 scales up to full lr-sized steps; any change of summation order
// (even gradient accumulation in one process) then moves it by 1e-4 of its norm. With eps above that
// noise the comparison measures the reduction, not the noise.
std::string write_recipe(const TempDir& dir, const std::string& name, const std::string& extra) {
  const auto& c = small_corpus();
  const std::string path = dir / (name + ".toml");
  write_file(path, "name = \"" + name + "\"\n" + R"(
[model]
n_layer = 2
n_head = 2
n_embd = 32
block_size = 32
vocab_size = 512
dropout = 0.0
[data]
tokenizer = ")" + c.tokenizer + R"("
dataset = ")" + c.dataset + R"("
prefetch = 2
[train]
batch_size = 8
grad_accum = 1
max_steps = 6
eval_every = 0
eval_batches = 2
log_every = 1
[optim]
lr = 3e-3
eps = 1e-5
warmup_steps = 2
decay_steps = 8
[checkpoint]
every = 0
keep_last = 2
[kernels]
attention = "fused"
gelu = "fused"
layer_norm = "fused"
gemm = "fused"
[output]
dir = ")" + (dir / name) + "\"\n" + extra);
  return path;
}

std::string latest_checkpoint(const std::string& run_dir) {
  std::ifstream latest(run_dir + "/checkpoints/latest");
  std::string name;
  latest >> name;
  return run_dir + "/checkpoints/" + name;
}

// One file or sharded with an index, as transformers reads them.
std::map<std::string, at::Tensor> final_weights(const std::string& run_dir) {
  const HfWeights w = HfWeights::open(latest_checkpoint(run_dir));
  std::map<std::string, at::Tensor> out;
  for (const auto& name : w.names()) out[name] = w.get(name);
  return out;
}

// Largest relative difference ||a - b|| / ||b|| over the tensors. Per tensor, not per element: AdamW
// divides each gradient by its own running magnitude, so an element whose gradient is ~0 moves by up to lr
// on float rounding alone (summing a batch in two halves rounds differently from summing it whole).
double max_relative_difference(const std::string& a_dir, const std::string& b_dir, const std::string& skip) {
  auto a = final_weights(a_dir), b = final_weights(b_dir);
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (auto& [name, t] : b) {
    if (!skip.empty() && name.find(skip) != std::string::npos) continue;
    if (!a.count(name)) {
      ADD_FAILURE() << name << " missing";
      continue;
    }
    const double scale = std::max(t.norm().item<double>(), 1e-30);
    worst = std::max(worst, (a[name] - t).norm().item<double>() / scale);
  }
  return worst;
}

// Run `b`'s metric `metric` step by step within `tolerance` (relative) of run `a`'s, both non-empty.
void expect_metric_close(const std::string& a_dir, const std::string& b_dir, const std::string& metric, double tolerance) {
  const auto a = metric_values(a_dir + "/metrics.jsonl", metric), b = metric_values(b_dir + "/metrics.jsonl", metric);
  ASSERT_EQ(a.size(), b.size()) << b_dir << " " << metric;
  ASSERT_FALSE(a.empty()) << a_dir << " " << metric;
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], tolerance * std::abs(a[i])) << b_dir << " " << metric << " " << i;
}

std::string venv_python() { return source_dir() + "/.venv/bin/python"; }
bool have_transformers() { return std::system(("'" + venv_python() + "' -c 'import transformers' >/dev/null 2>&1").c_str()) == 0; }

// transformers' AutoModelForCausalLM loads `checkpoint` as GPT-2 with no tensor missing, unexpected or
// mismatched (its output into `log`).
void expect_transformers_loads(const std::string& checkpoint, const std::string& log) {
  const std::string cmd = "'" + venv_python() + "' -c \"import sys, transformers\n"
                          "m, info = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], output_loading_info=True)\n"
                          "bad = {k: v for k, v in info.items() if v}\n"
                          "print('loaded', type(m).__name__, bad)\n"
                          "sys.exit(1 if bad else 0)\" '" + checkpoint + "' > '" + log + "' 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << read_file(log);
  EXPECT_NE(read_file(log).find("loaded GPT2LMHeadModel {}"), std::string::npos) << read_file(log);
}

Run train(const std::string& recipe, const std::string& args) {
  return run_colossal("train " + recipe + " -q " + args);
}

}  // namespace colossal::test
