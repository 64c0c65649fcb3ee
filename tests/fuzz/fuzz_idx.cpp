// Fuzz target: an IDX file (Fashion-MNIST's format), plain or gzip-compressed, as the image loader
// reads it from disk.
#include "src/data/idx.h"
#include "tests/fuzz/fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = colossal::fuzz::scratch_dir() + "/input.idx";
  colossal::fuzz::write_bytes(path, data, size);
  colossal::fuzz::reject_only([&] {
    const auto a = colossal::read_idx(path);
    size_t n = 1;
    for (int64_t d : a.dims) n *= static_cast<size_t>(d);
    if (n != a.values.size()) __builtin_trap();   // what the parser promises
  });
  return 0;
}
