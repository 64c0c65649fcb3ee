// Fuzz target: a checkpoint's trainer_state.json (step, data position, losses, kernel choices) beside a
// valid config.json, as resume reads it.
#include <filesystem>
#include <string>

#include "src/engine/checkpoint.h"
#include "tests/fuzz/fuzz_target.h"

namespace {

const char* kConfig = R"({"model_type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 32, "n_positions": 32,
                         "vocab_size": 512})";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string dir = colossal::fuzz::scratch_dir() + "/state-ckpt";
  std::filesystem::create_directories(dir);
  colossal::fuzz::write_bytes(dir + "/config.json", reinterpret_cast<const uint8_t*>(kConfig), std::string(kConfig).size());
  colossal::fuzz::write_bytes(dir + "/tokenizer.model", nullptr, 0);
  colossal::fuzz::write_bytes(dir + "/trainer_state.json", data, size);
  colossal::fuzz::reject_only([&] { (void)colossal::read_checkpoint_info(dir); });
  return 0;
}
