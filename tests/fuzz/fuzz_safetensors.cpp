// Fuzz target: the safetensors reader (8-byte header length, JSON header, tensor data), given the
// input as a file, as a checkpoint's model.safetensors.
#include "src/io/safetensors.h"
#include "tests/fuzz/fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = colossal::fuzz::scratch_dir() + "/model.safetensors";
  colossal::fuzz::write_bytes(path, data, size);
  colossal::fuzz::reject_only([&] { (void)colossal::load_safetensors(path); });
  return 0;
}
