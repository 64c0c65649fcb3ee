// Test support: see test_support.h.
#include "tests/support/test_support.h"

#include "src/dist/launcher.h"

#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <memory>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "src/core/error.h"
#include "src/nn/causal_lm.h"
#include "src/data/prepare.h"
#include "src/data/tokenizer.h"
#include "src/engine/checkpoint.h"

namespace fs = std::filesystem;

namespace colossal::test {

TempDir::TempDir() {
  std::string tmpl = (fs::temp_directory_path() / "colossal-test-XXXXXX").string();
  path_ = mkdtemp(tmpl.data());
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

std::string source_dir() { return COLOSSAL_SOURCE_DIR; }
std::string binary_path() { return COLOSSAL_BINARY; }

void write_file(const std::string& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << content;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

const SmallCorpus& small_corpus() {
  static TempDir dir;
  static SmallCorpus corpus = [] {
    SmallCorpus c{dir / "corpus.txt", dir / "tok.model", dir / "data.h5"};
    auto docs = read_documents(source_dir() + "/data/kjv/kjv.txt");
    std::string text;
    for (size_t i = 0; i < 120 && i < docs.size(); ++i) text += docs[i] + "\n\n";
    write_file(c.text, text);
    Tokenizer::train(c.text, 512, c.tokenizer);
    prepare_dataset(c.text, Tokenizer::load(c.tokenizer), c.dataset, 0.05);
    return c;
  }();
  return corpus;
}

Recipe tiny_training_recipe(const std::string& out, int64_t max_steps, const std::vector<std::string>& overrides) {
  const auto& c = small_corpus();
  std::vector<std::string> o = {"data.text=" + c.text, "data.tokenizer=" + c.tokenizer, "data.dataset=" + c.dataset,
                                "output.dir=" + out, "train.max_steps=" + std::to_string(max_steps)};
  o.insert(o.end(), overrides.begin(), overrides.end());
  return parse_recipe(R"(
[model]
n_layer = 2
n_head = 2
n_embd = 32
block_size = 32
vocab_size = 512
dropout = 0.1
[train]
batch_size = 4
grad_accum = 2
eval_every = 3
eval_batches = 2
[optim]
lr = 3e-3
warmup_steps = 2
decay_steps = 12
[checkpoint]
every = 3
keep_last = 2
)", "tiny.toml", o);
}

std::vector<double> metric_values(const std::string& metrics_path, const std::string& key) {
  std::vector<double> out;
  std::ifstream in(metrics_path);
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    if (j.contains(key) && !j.contains("event") && !j[key].is_null()) out.push_back(j[key].get<double>());
  }
  return out;
}

Run run_colossal(const std::string& args) {
  std::string cmd = "cd '" + source_dir() + "' && '" + binary_path() + "' " + args + " 2>&1";
  Run r;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) r.output.append(buf, n);
  int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

std::string headless_dom(const std::string& url, const std::string& scratch_dir, int budget_ms, std::string& why) {
  std::string browser;
  for (const char* name : {"chromium", "chromium-browser", "google-chrome"})
    if (std::system(("command -v " + std::string(name) + " >/dev/null 2>&1").c_str()) == 0) {
      browser = name;
      break;
    }
  if (browser.empty()) {
    why = "no chromium on PATH (Debian's chromium package; scripts/setup.sh installs it for the tests)";
    return "";
  }
  const std::string log = scratch_dir + "/chrome.log";
  const std::string command = browser + " --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --user-data-dir=" + scratch_dir +
                              "/chrome --virtual-time-budget=" + std::to_string(budget_ms) + " --dump-dom '" + url + "' 2>" + log;
  std::string dom;
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"), pclose);
  if (!pipe) return "";
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, pipe.get())) > 0;) dom.append(buf, n);
  if (dom.find("<body") != std::string::npos) return dom;
  why = "chromium could not start here: " + read_file(log).substr(0, 400);
  return "";
}

std::string fixture(const std::string& name) { return source_dir() + "/tests/fixtures/" + name; }
std::string tokenizer_fixture(const std::string& name) {
  return fixture(name == "opt-tiny" || name == "bloom-tiny" ? name : "tokenizers/" + name);
}

std::shared_ptr<nn::CausalLM> load_model(const std::string& dir) {
  nn::LayerFactory f;
  auto m = nn::model_as<nn::CausalLM>(load_pretrained(dir, f), "load_model");
  m->eval();
  return m;
}

nlohmann::json read_json_file(const std::string& path) { return nlohmann::json::parse(read_file(path)); }

void expect_hf_gradients_match(nn::Model& model, const SafetensorsFile& ref, double tolerance) {
  size_t compared = 0, grads = 0;
  for (auto& item : model.named_parameters()) {
    const at::Tensor g = item.value().grad();
    ASSERT_TRUE(g.defined()) << item.key() << " has no gradient";
    for (const auto& [name, piece] : hf_pieces(model.hf_names().to_hf(item.key()), g)) {   // parts, transposes, interleaves
      const auto& expected = ref.at("grad." + name, "ref");
      ASSERT_EQ(piece.sizes(), expected.sizes()) << name;
      EXPECT_LT((piece - expected).abs().max().item<double>(), tolerance) << name;
      ++compared;
    }
  }
  for (const auto& [name, t] : ref.tensors) grads += name.rfind("grad.", 0) == 0;
  EXPECT_EQ(compared, grads);   // every HF parameter's gradient
}

std::string pinned_kernels() {
  return " --set kernels.attention=fused --set kernels.gelu=fused --set kernels.gemv=fused --set kernels.layer_norm=fused"
         " --set kernels.gemm=fused";
}

void expect_one_line_error(const Run& r, const std::string& fragment) {
  EXPECT_NE(r.exit_code, 0) << r.output;
  std::string last = r.output;
  while (!last.empty() && last.back() == '\n') last.pop_back();
  last = last.substr(last.rfind('\n') == std::string::npos ? 0 : last.rfind('\n') + 1);
  EXPECT_EQ(last.rfind("error: ", 0), 0u) << r.output;
  EXPECT_NE(last.find(fragment), std::string::npos) << "expected \"" << fragment << "\" in: " << last;
}

dist::WorkerEnv env_for(int64_t rank, int64_t world, int port) {
  dist::WorkerEnv e;
  e.source = "torchrun";
  e.rank = rank;
  e.world = world;
  e.local_rank = rank;
  e.local_world = world;
  e.master_addr = "127.0.0.1";
  e.master_port = port;
  return e;
}

dist::MeshShape dp_mesh(int64_t world) {
  dist::MeshShape m;
  m.size[static_cast<int>(dist::Dim::dp)] = world;
  return m;
}

std::vector<std::string> run_ranks(int64_t world, const std::function<void(int64_t, dist::Runtime&)>& fn, double timeout_s,
                                   dist::MeshShape shape) {
  if (shape.world() == 1) shape = dp_mesh(world);
  const int port = dist::free_local_port();
  std::vector<std::string> errors(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        dist::JoinOptions o;
        o.timeout_s = timeout_s;
        auto rt = dist::Runtime::join(env_for(r, world, port), shape, o);
        fn(r, *rt);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

}  // namespace colossal::test
