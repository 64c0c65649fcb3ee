// Test support: temporary directories, a small corpus with its tokenizer and dataset built once per
// test binary, and running the colossal binary as a user would.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "src/core/recipe.h"
#include "src/dist/runtime.h"
#include "src/io/safetensors.h"
#include "src/nn/causal_lm.h"

namespace colossal::test {

// A fresh directory under the system temp dir, removed when the object dies.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// The first `documents` chapters of the embedded corpus, a 512-piece tokenizer and a dataset,
// built once per process in a temporary directory.
struct SmallCorpus {
  std::string text, tokenizer, dataset;
};
const SmallCorpus& small_corpus();

// A 2-layer, width-32 GPT recipe over small_corpus() writing into `out`: dropout 0.1, grad_accum 2,
// eval and checkpoint every 3 steps (keep 2), warmup 2, cosine over 12. `overrides` as with --set.
Recipe tiny_training_recipe(const std::string& out, int64_t max_steps, const std::vector<std::string>& overrides = {});

// A torchrun-style environment for rank `rank` of `world` on 127.0.0.1:`port`, and a mesh of `world`
// data-parallel ranks.
dist::WorkerEnv env_for(int64_t rank, int64_t world, int port);
dist::MeshShape dp_mesh(int64_t world);
// Runs fn(rank, runtime) on `world` threads (each rank its own rendezvous client and Gloo groups on
// 127.0.0.1, a free port) over `shape` (default: all data-parallel); returns each rank's error message
// ("" = none).
std::vector<std::string> run_ranks(int64_t world, const std::function<void(int64_t, dist::Runtime&)>& fn, double timeout_s = 20,
                                   dist::MeshShape shape = {});

// The one-line message of the colossal::Error `f` throws, or "(no error)".
std::string error_of(const std::function<void()>& f);

std::string source_dir();                       // the repository root
std::string fixture(const std::string& name);   // tests/fixtures/<name>
// A tokenizer fixture's directory: the opt-tiny and bloom-tiny model directories, else tests/fixtures/tokenizers/<name>.
std::string tokenizer_fixture(const std::string& name);
// A model directory (a checkpoint or a Hugging Face one) loaded as infer loads it, in eval mode.
std::shared_ptr<nn::CausalLM> load_model(const std::string& dir);
std::string binary_path();                      // the colossal binary under test
void write_file(const std::string& path, const std::string& content);
std::string read_file(const std::string& path);
nlohmann::json read_json_file(const std::string& path);

// Every gradient of `model`, laid out under HF names, against the reference's "grad.<name>" tensors
// within `tolerance`, and every one of those compared.
void expect_hf_gradients_match(nn::Model& model, const SafetensorsFile& ref, double tolerance = 1e-4);

// --set flags pinning every CPU kernel choice: kernels chosen by timing may differ between two
// processes on a busy machine (in the last bits), so runs compared bit for bit pin them.
std::string pinned_kernels();

// Values of `key` in a run's metrics.jsonl, in order (event records such as start/end skipped).
std::vector<double> metric_values(const std::string& metrics_path, const std::string& key);   // nulls (inf, NaN) left out

struct Run {
  int exit_code = -1;
  std::string output;   // stdout and stderr together
};
// Runs the colossal binary with `args` (a shell-quoted string) from the repository root.
Run run_colossal(const std::string& args);
// The DOM of `url` once headless Chromium has run its scripts for `budget_ms` of virtual time (network
// waits pass in real time), its profile and log in `scratch_dir`. "" with `why` set when no Chromium is
// on PATH or it cannot start here (callers skip with that reason).
std::string headless_dom(const std::string& url, const std::string& scratch_dir, int budget_ms, std::string& why);

// A user-facing failure: non-zero exit and a last line starting with "error: " holding `fragment`.
void expect_one_line_error(const Run& r, const std::string& fragment);

}  // namespace colossal::test
