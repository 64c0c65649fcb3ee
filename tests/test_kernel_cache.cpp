// The kernel-choice cache kept between processes (src/engine/kernel_cache.h).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "src/engine/kernel_cache.h"
#include "src/nn/kernel_choice.h"
#include "tests/support/test_support.h"

using namespace colossal;
using colossal::test::TempDir;

namespace {

const std::map<std::string, std::string> kChoices = {{"gemm fwd rows=64 in=768 out=2304", "fused"},
                                                     {"gemv rows=1 in=768 out=768", "aten"}};

// Sets an environment variable for the test's length, restoring what it was.
struct ScopedEnv {
  std::string name;
  std::optional<std::string> before;
  ScopedEnv(std::string n, const char* value) : name(std::move(n)) {
    if (const char* b = std::getenv(name.c_str())) before = b;
    value ? setenv(name.c_str(), value, 1) : unsetenv(name.c_str());
  }
  ~ScopedEnv() { before ? setenv(name.c_str(), before->c_str(), 1) : unsetenv(name.c_str()); }
};

// Clears the process's choices when a test ends.
struct PolicyGuard {
  PolicyGuard() { nn::set_kernel_policy({}); }
  ~PolicyGuard() { nn::set_kernel_policy({}); }
};

nlohmann::json entries_of(const std::string& file) { return nlohmann::json::parse(colossal::test::read_file(file))["entries"]; }

}  // namespace

TEST(KernelCache, ChoicesSavedByOneProcessAreLoadedByTheNextUnderTheirKeyOnly) {
  PolicyGuard guard;
  TempDir dir;
  const std::string file = dir / "sub/choices.json";   // its directory is created on saving
  nn::restore_kernel_choices(kChoices);
  save_kernel_cache(file, "machine A");
  nn::set_kernel_policy({});   // a new process: nothing chosen
  EXPECT_EQ(load_kernel_cache(file, "machine B"), 0u);
  EXPECT_TRUE(nn::kernel_choices().empty());
  EXPECT_EQ(load_kernel_cache(file, "machine A"), 2u);
  EXPECT_EQ(nn::kernel_choices(), kChoices);
  // Loaded choices are decided: no timing at those shapes.
  EXPECT_EQ(nn::decided_ours("gemm", nn::KernelPath::Auto, "fwd rows=64 in=768 out=2304"), std::optional<bool>(true));
  EXPECT_EQ(nn::decided_ours("gemv", nn::KernelPath::Auto, "rows=1 in=768 out=768"), std::optional<bool>(false));

  // Another key's save keeps this one.
  nn::set_kernel_policy({});
  nn::restore_kernel_choices({{"gelu n=4096", "aten"}});
  save_kernel_cache(file, "machine B");
  const auto entries = entries_of(file);
  EXPECT_EQ(entries.size(), 2u);
  EXPECT_EQ((entries["machine A"]["choices"].get<std::map<std::string, std::string>>()), kChoices);
  EXPECT_EQ(entries["machine B"]["choices"]["gelu n=4096"], "aten");
}

TEST(KernelCache, ASaveWithNothingNewLeavesTheFileAsItWasAndNewChoicesMerge) {
  PolicyGuard guard;
  TempDir dir;
  const std::string file = dir / "choices.json";
  nn::restore_kernel_choices(kChoices);
  save_kernel_cache(file, "k");
  const std::string first = colossal::test::read_file(file);
  save_kernel_cache(file, "k");
  EXPECT_EQ(colossal::test::read_file(file), first);
  nn::set_kernel_policy({});   // a later process that timed one more shape
  ASSERT_EQ(load_kernel_cache(file, "k"), 2u);
  nn::restore_kernel_choices({{"layer_norm rows=1 cols=768 fwd", "fused"}});
  save_kernel_cache(file, "k");
  EXPECT_EQ(entries_of(file)["k"]["choices"].size(), 3u);
}

TEST(KernelCache, AnUnreadableFileIsIgnoredAndRewrittenWhole) {
  PolicyGuard guard;
  TempDir dir;
  const std::string file = dir / "choices.json";
  for (const char* junk : {"{ not json", "[1, 2]", "{\"format\": 7, \"entries\": {}}", "{\"format\": 1, \"entries\": {\"k\": 5}}"}) {
    std::ofstream(file) << junk;
    EXPECT_EQ(load_kernel_cache(file, "k"), 0u) << junk;
    nn::restore_kernel_choices(kChoices);
    save_kernel_cache(file, "k");
    nn::set_kernel_policy({});
    EXPECT_EQ(load_kernel_cache(file, "k"), 2u) << junk;
    nn::set_kernel_policy({});
  }
  // A choice that is neither side is skipped, not trusted.
  std::ofstream(file) << R"({"format": 1, "entries": {"k": {"written": 1, "choices": {"gemm a": "fused", "gemm b": "mkl", "gemm c": 3}}}})";
  EXPECT_EQ(load_kernel_cache(file, "k"), 1u);
}

TEST(KernelCache, OnlyTheMostRecentlyWrittenKeysAreKept) {
  PolicyGuard guard;
  TempDir dir;
  const std::string file = dir / "choices.json";
  // Entries written long ago, oldest first, then one more: the oldest goes.
  nlohmann::json entries = nlohmann::json::object();
  for (size_t i = 0; i < kKeptKeys; ++i) entries["old " + std::to_string(i)] = {{"written", 1000 + i}, {"choices", {{"gemm x", "aten"}}}};
  std::ofstream(file) << nlohmann::json{{"format", 1}, {"entries", entries}}.dump();
  nn::restore_kernel_choices(kChoices);
  save_kernel_cache(file, "new");
  const auto after = entries_of(file);
  EXPECT_EQ(after.size(), kKeptKeys);
  EXPECT_FALSE(after.contains("old 0"));
  EXPECT_TRUE(after.contains("old 1"));
  EXPECT_TRUE(after.contains("new"));
}

TEST(KernelCache, ItsFileFollowsTheEnvironmentAndOffTurnsItOff) {
  {
    ScopedEnv off("COLOSSAL_KERNEL_CACHE", "off");
    EXPECT_FALSE(kernel_cache_path().has_value());
  }
  {
    ScopedEnv named("COLOSSAL_KERNEL_CACHE", "/somewhere/k.json");
    EXPECT_EQ(kernel_cache_path(), std::optional<std::string>("/somewhere/k.json"));
  }
  ScopedEnv unset("COLOSSAL_KERNEL_CACHE", nullptr);
  {
    ScopedEnv xdg("XDG_CACHE_HOME", "/xdg");
    EXPECT_EQ(kernel_cache_path(), std::optional<std::string>("/xdg/colossal/kernel-choices.json"));
  }
  ScopedEnv no_xdg("XDG_CACHE_HOME", nullptr);
  ScopedEnv home("HOME", "/home/u");
  EXPECT_EQ(kernel_cache_path(), std::optional<std::string>("/home/u/.cache/colossal/kernel-choices.json"));
  // The key names what the choices depend on.
  const std::string key = kernel_cache_key();
  for (const char* part : {" threads", "LibTorch ", " bytes, modified "}) EXPECT_NE(key.find(part), std::string::npos) << key;
  // ATen capped to AVX2 runs other BLAS kernels: its choices are another entry.
  ScopedEnv no_aten("ATEN_CPU_CAPABILITY", nullptr), no_onednn("ONEDNN_MAX_CPU_ISA", nullptr);
  std::string uncapped;
  {
    ScopedEnv no_mkl("MKL_ENABLE_INSTRUCTIONS", nullptr);
    uncapped = kernel_cache_key();
  }
  ScopedEnv mkl("MKL_ENABLE_INSTRUCTIONS", "AVX2");
  EXPECT_NE(kernel_cache_key(), uncapped);
  EXPECT_NE(kernel_cache_key().find("MKL_ENABLE_INSTRUCTIONS=AVX2"), std::string::npos) << kernel_cache_key();
}
