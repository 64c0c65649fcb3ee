// Timed kernel choices kept between processes: see kernel_cache.h.
#include "src/engine/kernel_cache.h"

#include <ATen/Parallel.h>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <torch/headeronly/version.h>
#include <vector>

#include "kernels/cpu/isa.h"
#include "src/io/atomic_dir.h"
#include "src/nn/kernel_choice.h"

namespace colossal {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
constexpr int kFormat = 1;

// The CPU's model name with its family and model numbers: cloud VMs often name only "AMD EPYC", and the
// numbers still tell a Zen 4 (family 25) from a Zen 5 (26), whose timings differ (a shared home
// directory across a cluster's mixed nodes would otherwise share one entry).
std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string name, family, model;
  auto value = [](const std::string& line) {
    const auto colon = line.find(':');
    const auto start = colon == std::string::npos ? std::string::npos : line.find_first_not_of(' ', colon + 1);
    return start == std::string::npos ? std::string() : line.substr(start);
  };
  for (std::string line; std::getline(in, line) && line.find_first_not_of(" \t") != std::string::npos;) {   // the first CPU
    if (line.rfind("model name", 0) == 0) name = value(line);
    else if (line.rfind("cpu family", 0) == 0) family = value(line);
    else if (line.rfind("model", 0) == 0 && line.find_first_of(" \t:") == 5) model = value(line);
  }
  if (name.empty()) name = "unknown CPU";
  return family.empty() ? name : name + " [family " + family + " model " + model + "]";
}

// This binary, by size and modification time: a rebuild changes the kernels the choices compared.
std::string this_binary() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return "unknown binary";
  const auto size = fs::file_size(exe, ec);
  const auto mtime = fs::last_write_time(exe, ec);
  if (ec) return exe.string();
  return exe.string() + " " + std::to_string(size) + " bytes, modified " +
         std::to_string(std::chrono::duration_cast<std::chrono::seconds>(mtime.time_since_epoch()).count());
}

// The file's entries, or an empty object (with a warning when the file exists but cannot be used).
json read_entries(const std::string& file) {
  std::error_code ec;
  if (!fs::exists(file, ec)) return json::object();
  try {
    json doc = json::parse(read_text_file(file));
    if (!doc.is_object() || doc.value("format", 0) != kFormat || !doc.contains("entries") || !doc["entries"].is_object())
      throw std::runtime_error("not a format-" + std::to_string(kFormat) + " kernel cache");
    return doc["entries"];
  } catch (const std::exception& e) {
    spdlog::warn("kernel cache {}: ignored ({}); it is rewritten when this run saves", file, e.what());
    return json::object();
  }
}

std::map<std::string, std::string> choices_of(const json& entry) {
  std::map<std::string, std::string> out;
  if (!entry.is_object() || !entry.contains("choices") || !entry["choices"].is_object()) return out;
  for (const auto& [k, v] : entry["choices"].items())
    if (v.is_string() && (v == "fused" || v == "aten")) out[k] = v.get<std::string>();
  return out;
}

// The caps put on ATen's side (its dispatch level, MKL's and oneDNN's instruction sets), when any is
// set: capped, ATen's GEMM is another kernel, and a choice timed against the uncapped one does not hold.
std::string aten_caps() {
  std::string caps;
  for (const char* name : {"ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA"})
    if (const char* v = std::getenv(name); v && *v) caps += std::string(caps.empty() ? " | " : " ") + name + "=" + v;
  return caps;
}

}  // namespace

std::optional<std::string> kernel_cache_path() {
  if (const char* set = std::getenv("COLOSSAL_KERNEL_CACHE"); set && *set)
    return std::string(set) == "off" ? std::nullopt : std::optional<std::string>(set);
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) return (fs::path(xdg) / "colossal" / "kernel-choices.json").string();
  if (const char* home = std::getenv("HOME"); home && *home)
    return (fs::path(home) / ".cache" / "colossal" / "kernel-choices.json").string();
  return std::nullopt;
}

std::string kernel_cache_key() {
  // A weight-stream count set by hand changes our GEMVs' speed against ATen's, so its choices are its own.
  const char* streams = std::getenv("COLOSSAL_WEIGHT_STREAMS");
  return cpu_model() + " | " + kernels::isa_name(kernels::active_isa()) + aten_caps() +
         (streams && *streams ? std::string(" | COLOSSAL_WEIGHT_STREAMS=") + streams : std::string()) + " | " +
         std::to_string(at::get_num_threads()) + " threads | LibTorch " + TORCH_VERSION + " | " + this_binary();
}

size_t load_kernel_cache(const std::string& file, const std::string& key) {
  const json entries = read_entries(file);
  if (!entries.contains(key)) return 0;
  const auto choices = choices_of(entries[key]);
  nn::restore_kernel_choices(choices);
  return choices.size();
}

void save_kernel_cache(const std::string& file, const std::string& key) {
  const auto now = nn::kernel_choices();
  if (now.empty()) return;
  json entries = read_entries(file);
  auto merged = entries.contains(key) ? choices_of(entries[key]) : std::map<std::string, std::string>{};
  const auto before = merged;
  for (const auto& [k, v] : now) merged[k] = v;
  if (merged == before) return;   // nothing new: leave the file as it is
  entries[key] = {{"written", std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count()},
                  {"choices", merged}};
  // Each rebuild is a new key: keep the most recently written ones.
  while (entries.size() > kKeptKeys) {
    std::string oldest;
    int64_t at = INT64_MAX;
    for (const auto& [k, v] : entries.items())
      if (const int64_t w = v.is_object() ? v.value("written", int64_t{0}) : 0; w < at) at = w, oldest = k;
    entries.erase(oldest);
  }
  try {
    if (const fs::path dir = fs::path(file).parent_path(); !dir.empty()) fs::create_directories(dir);
    write_file_atomic(file, json{{"format", kFormat}, {"entries", entries}}.dump(1) + "\n");
    spdlog::debug("kernel cache {}: {} choices saved", file, merged.size());
  } catch (const std::exception& e) {
    spdlog::warn("kernel cache {}: not saved ({})", file, e.what());
  }
}

KernelCacheSession::KernelCacheSession() : file_(kernel_cache_path()) {
  if (!file_) return;
  key_ = kernel_cache_key();
  if (const size_t n = load_kernel_cache(*file_, key_); n > 0)
    spdlog::info("kernels: {} choices timed by an earlier run on this machine, from {}", n, *file_);
}

KernelCacheSession::~KernelCacheSession() {
  try {   // a destructor may run while an error unwinds: the cache must never end the process
    save();
  } catch (const std::exception& e) {
    spdlog::warn("kernel cache: not saved ({})", e.what());
  }
}

void KernelCacheSession::save() {
  if (file_) save_kernel_cache(*file_, key_);
}

}  // namespace colossal
