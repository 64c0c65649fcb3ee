// Helpers of the tests that run `colossal train` on a small GPT and compare runs: the recipe, the
// final weights of a run, their largest relative difference, metrics step by step.
#pragma once
#include <ATen/core/Tensor.h>

#include <map>
#include <string>

#include "tests/support/test_support.h"

namespace colossal::test {

// A 2-layer width-32 GPT on the shared small corpus, writing into dir/name (see train_runs.cpp).
std::string write_recipe(const TempDir& dir, const std::string& name, const std::string& extra = "");
std::string latest_checkpoint(const std::string& run_dir);
// The run's last checkpoint's tensors by HF name (one file or sharded with an index).
std::map<std::string, at::Tensor> final_weights(const std::string& run_dir);
// Largest ||a - b|| / ||b|| over the tensors (those whose name holds `skip` left out).
double max_relative_difference(const std::string& a_dir, const std::string& b_dir, const std::string& skip = "");
// Run `b`'s metric `metric` step by step within `tolerance` (relative) of run `a`'s, both non-empty.
void expect_metric_close(const std::string& a_dir, const std::string& b_dir, const std::string& metric, double tolerance = 1e-5);
std::string venv_python();
bool have_transformers();
// transformers' AutoModelForCausalLM loads `checkpoint` as GPT-2 with nothing missing or unexpected.
void expect_transformers_loads(const std::string& checkpoint, const std::string& log);
// `colossal train recipe -q args`.
Run train(const std::string& recipe, const std::string& args);

}  // namespace colossal::test
