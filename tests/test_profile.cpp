// `colossal profile` end to end: the report's figures against the model's own arithmetic (elements per
// block from GPT-2's shapes, bytes per element from the stage, precision and optimizer), where each chunk
// lived over the traced step, and the HTML page as a browser draws it (headless Chromium, skipped with
// the reason where it cannot start).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>

#include "tests/support/test_support.h"

namespace fs = std::filesystem;
using colossal::test::read_json_file;
using colossal::test::run_colossal;
using colossal::test::TempDir;

namespace {

// gpt-tiny's shapes (recipes/gpt-tiny.toml): width 128, 2 blocks, vocabulary 1024, context 128.
constexpr int64_t C = 128, kBlocks = 2, V = 1024, P = 128;
constexpr int64_t kBlockElements = 12 * C * C + 13 * C;    // qkv, proj, fc, fc-proj with biases; two norms
constexpr int64_t kOutsideElements = V * C + P * C + 2 * C;   // token and position tables, final norm (head tied)

// `colossal profile` on gpt-tiny with `extra` flags, its outputs in dir/profile; the JSON it wrote.
nlohmann::json profile(const TempDir& dir, const std::string& extra, std::string* console = nullptr) {
  const auto r = run_colossal("profile recipes/gpt-tiny.toml --steps 2 --out " + (dir / "profile") + " --set train.batch_size=2" +
                              " --set train.seq_len=64 --set data.tokenizer=" + (dir / "tok.model") + " --set data.dataset=" +
                              (dir / "data.h5") + extra);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  if (console) *console = r.output;
  if (r.exit_code != 0) return {};
  return read_json_file(dir / "profile/profile.json");
}

// gpt-tiny's blocks have one shape, so each forward keeps the same activations (within 5%: a block's
// figure is a difference of live bytes, which allocator-sized workspace can nudge).
void expect_equal_activations(const nlohmann::json& p) {
  const double first = p["blocks"][0]["activations"].get<double>();
  EXPECT_GT(first, 0);
  for (int64_t b = 1; b < kBlocks; ++b) EXPECT_NEAR(p["blocks"][b]["activations"].get<double>(), first, 0.05 * first) << p["blocks"].dump();
}

int64_t chunk_elements(const nlohmann::json& p) {
  int64_t n = 0;
  for (const auto& c : p["chunks"]) n += c["elements"].get<int64_t>();
  return n;
}

}  // namespace

TEST(Profile, TotalsAreTheStoresBytesForTheModelsElementsAndEveryBlockIsCounted) {
  TempDir dir;
  std::string console;
  const auto p = profile(dir, "", &console);
  ASSERT_FALSE(p.empty());
  // The chunks hold every parameter once, plus padding of less than one chunk's worth.
  const int64_t elements = kBlocks * kBlockElements + kOutsideElements;
  EXPECT_EQ(p["elements"].get<int64_t>(), elements);
  const int64_t padded = chunk_elements(p);
  EXPECT_EQ(p["padded_elements"].get<int64_t>(), padded);
  EXPECT_GE(padded, elements);
  // Stage 0 in fp32 with AdamW: 4 bytes of parameter, 4 of gradient and 8 of moments per element.
  const auto& t = p["totals"];
  EXPECT_EQ(t["params"].get<int64_t>(), 4 * padded);
  EXPECT_EQ(t["grads"].get<int64_t>(), 4 * padded);
  EXPECT_EQ(t["optimizer"].get<int64_t>(), 8 * padded);
  EXPECT_EQ(t["nvme"].get<int64_t>(), 0);
  // Per block: GPT-2's elements, the chunks' bytes shared out so they add up to the totals, and
  // activations kept by every block's forward.
  ASSERT_EQ(p["blocks"].size(), static_cast<size_t>(kBlocks + 1));
  double params = 0, grads = 0, optimizer = 0;
  for (const auto& b : p["blocks"]) {
    const bool outside = b["block"].is_string();
    EXPECT_EQ(b["elements"].get<int64_t>(), outside ? kOutsideElements : kBlockElements) << b.dump();
    params += b["params"].get<double>();
    grads += b["grads"].get<double>();
    optimizer += b["optimizer"].get<double>();
    if (outside) continue;
    EXPECT_GT(b["activations"].get<double>(), 0) << b.dump();
    EXPECT_GT(b["backward_peak"].get<double>(), 0) << b.dump();
  }
  expect_equal_activations(p);
  EXPECT_NEAR(params, t["params"].get<double>(), 1);
  EXPECT_NEAR(grads, t["grads"].get<double>(), 1);
  EXPECT_NEAR(optimizer, t["optimizer"].get<double>(), 1);
  // The step's live memory holds the store's tensors (counted from before the model was built) and more.
  EXPECT_GT(p["peak"]["bytes"].get<int64_t>(), t["params"].get<int64_t>() + t["grads"].get<int64_t>() + t["optimizer"].get<int64_t>());
  // Events: the step's marks, each block's forward and backward entered and left, a tier per chunk.
  int marks = 0, block_events = 0;
  for (const auto& e : p["events"]) {
    EXPECT_EQ(e["tiers"].get<std::string>().size(), p["chunks"].size());
    EXPECT_GE(e["peak"].get<int64_t>(), e["live"].get<int64_t>());
    (e["block"].get<int64_t>() < 0 ? marks : block_events)++;
  }
  EXPECT_EQ(block_events, 4 * kBlocks);   // one micro-batch: forward and backward, each entered and left
  EXPECT_EQ(marks, 4);                    // forward, backward, update, step end
  // The console table: a row per block and the outside tensors, and where the files went.
  EXPECT_NE(console.find("memory profile: recipes/gpt-tiny.toml"), std::string::npos) << console;
  EXPECT_NE(console.find("outside"), std::string::npos) << console;
  EXPECT_NE(console.find("wrote " + (dir / "profile") + "/profile.json"), std::string::npos) << console;
  EXPECT_TRUE(fs::exists(dir / "profile/profile.html"));
  EXPECT_FALSE(fs::exists(dir / "profile/checkpoints/latest"));   // a profile saves no checkpoint
}

TEST(Profile, ParametersOnNvmeAreOnDiskBetweenUsesAndWholeWhileTheirBlockRuns) {
  TempDir dir;
  fs::create_directory(dir / "nvme");
  const auto p = profile(dir, " --set memory.zero=3 --set memory.offload_optimizer=nvme --set memory.offload_params=nvme --set memory.nvme_path=" +
                                  (dir / "nvme") + " --set memory.chunk_size_mb=0.25");
  ASSERT_FALSE(p.empty());
  // The file holds the fp32 master and both moments: 12 bytes per element, each segment rounded up
  // to the disk's alignment.
  const int64_t padded = chunk_elements(p), nvme = p["totals"]["nvme"].get<int64_t>();
  EXPECT_GE(nvme, 12 * padded);
  EXPECT_LT(nvme, 12 * padded + 3 * 4096 * static_cast<int64_t>(p["chunks"].size()));
  // Chunks of block b: on NVMe before the step, whole while b's forward runs.
  std::vector<std::vector<size_t>> of_block(kBlocks);
  for (const auto& c : p["chunks"]) {
    const auto& owners = c["blocks"];
    if (owners.size() == 1 && owners[0].get<int64_t>() >= 0) of_block[owners[0].get<size_t>()].push_back(c["chunk"].get<size_t>());
  }
  const auto& events = p["events"];
  ASSERT_FALSE(events.empty());
  int checked = 0;
  for (int64_t b = 0; b < kBlocks; ++b) {
    ASSERT_FALSE(of_block[static_cast<size_t>(b)].empty()) << "block " << b << " has no chunk of its own: " << p["chunks"].dump();
    for (size_t c : of_block[static_cast<size_t>(b)]) EXPECT_EQ(events[0]["tiers"].get<std::string>()[c], 'n') << "chunk " << c;
    for (const auto& e : events) {
      if (e["block"].get<int64_t>() != b || e["phase"] != "forward" || !e["enter"].get<bool>()) continue;
      for (size_t c : of_block[static_cast<size_t>(b)]) EXPECT_EQ(e["tiers"].get<std::string>()[c], 'w') << "chunk " << c;
      ++checked;
    }
  }
  EXPECT_EQ(checked, kBlocks);
  // The staging buffers are the offload's own memory, not ATen's: activations are still each block's.
  EXPECT_GT(p["totals"]["staging"].get<int64_t>(), 0);
  expect_equal_activations(p);
  EXPECT_TRUE(fs::is_empty(dir / "nvme"));   // the offload file left with the run
}

TEST(Profile, UnderPlacementCpuBlockChunksWaitInHostMemoryAndTheHostBytesAreTheirs) {
  TempDir dir;
  const auto p = profile(dir, " --set memory.zero=3 --set memory.placement=cpu --set memory.chunk_size_mb=0.25");
  ASSERT_FALSE(p.empty());
  // Before the step every block chunk is a shard in host memory; a chunk holding any tensor outside the
  // blocks (the embeddings, final norm) stays whole.
  auto outer = [](const nlohmann::json& c) {
    for (const auto& b : c["blocks"])
      if (b.get<int64_t>() < 0) return true;
    return false;
  };
  const std::string first = p["events"][0]["tiers"].get<std::string>();
  int host = 0;
  for (const auto& c : p["chunks"]) {
    const char tier = first[c["chunk"].get<size_t>()];
    if (outer(c)) EXPECT_EQ(tier, 'w') << c.dump();
    else host += tier == 'h';
  }
  EXPECT_GT(host, 0);
  EXPECT_EQ(p["tiers"]["h"], "this rank's shard in host memory");
  // One rank, fp32, AdamW: the host holds every chunk's optimizer side (gradient shard and both
  // moments: 12 bytes an element) and the block chunks' parameter shards (4 more).
  int64_t expected = 0;
  for (const auto& c : p["chunks"]) expected += (outer(c) ? 12 : 16) * c["elements"].get<int64_t>();
  EXPECT_EQ(p["totals"]["host"].get<int64_t>(), expected);
}

TEST(Profile, HtmlPageDrawsBothPlotsInHeadlessChromium) {
  TempDir dir;
  const auto p = profile(dir, "");
  ASSERT_FALSE(p.empty());
  // The page's script writes, once laid out, how many of each plot's shapes have a non-empty box.
  std::string why;
  const std::string dom = colossal::test::headless_dom("file://" + (dir / "profile/profile.html"), dir.path(), 5000, why);
  if (dom.empty()) GTEST_SKIP() << why;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(dom, m, std::regex("data-rendered=\"memory:(\\d+) chunks:(\\d+)\""))) << dom.substr(0, 2000);
  EXPECT_GE(std::stoi(m[1]), 4) << "the stacked areas and the peak line";
  EXPECT_GE(std::stoi(m[2]), static_cast<int>(p["chunks"].size())) << "at least one run of cells per chunk";
}
