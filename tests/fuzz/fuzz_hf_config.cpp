// Fuzz target: a checkpoint's config.json (the Hugging Face config) as read_checkpoint_info reads it.
// An accepted config is then priced (parameter count) as infer does before allocating.
#include <filesystem>

#include "src/engine/checkpoint.h"
#include "models/registry.h"
#include "tests/fuzz/fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string dir = colossal::fuzz::scratch_dir() + "/config-ckpt";
  std::filesystem::create_directories(dir);
  colossal::fuzz::write_bytes(dir + "/config.json", data, size);
  colossal::fuzz::write_bytes(dir + "/tokenizer.model", nullptr, 0);
  colossal::fuzz::reject_only([&] {
    const auto info = colossal::read_checkpoint_info(dir);
    (void)colossal::count_parameters(info.model);
  });
  return 0;
}
