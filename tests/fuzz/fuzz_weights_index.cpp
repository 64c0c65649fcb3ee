// Fuzz target: a sharded checkpoint's index as HfWeights::open reads it, beside two real shards
// (a.safetensors holds "x", b.safetensors holds "y"), so an input can name, omit, misplace or invent
// shards and tensors: as model.safetensors.index.json, and as optimizer.safetensors.index.json whose
// metadata also carries fp16's loss-scale state (read by LossScaler::load_state).
#include <filesystem>

#include <ATen/ATen.h>

#include "src/io/hf_weights.h"
#include "src/memory/loss_scaler.h"
#include "tests/fuzz/fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string dir = colossal::fuzz::scratch_dir() + "/sharded";
  static const bool shards = [&] {
    std::filesystem::create_directories(dir);
    colossal::save_safetensors(dir + "/a.safetensors", {{"x", at::ones({2, 3})}});
    colossal::save_safetensors(dir + "/b.safetensors", {{"y", at::zeros({4})}});
    return true;
  }();
  (void)shards;
  colossal::fuzz::write_bytes(dir + "/model.safetensors.index.json", data, size);
  colossal::fuzz::reject_only([&] {
    const auto w = colossal::HfWeights::open(dir);
    for (const auto& name : w.names()) (void)w.get(name).numel();
  });
  std::filesystem::rename(dir + "/model.safetensors.index.json", dir + "/optimizer.safetensors.index.json");
  colossal::fuzz::reject_only([&] {
    const auto w = colossal::HfWeights::open(dir, "optimizer");
    for (const auto& name : w.names()) (void)w.get(name).numel();
    colossal::memory::LossScaler scaler({});
    scaler.load_state(w.metadata(), w.describe());
  });
  std::filesystem::remove(dir + "/optimizer.safetensors.index.json");
  return 0;
}
