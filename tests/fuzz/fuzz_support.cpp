// Scratch files for the fuzz targets: see fuzz_target.h.
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "tests/fuzz/fuzz_target.h"

namespace colossal::fuzz {

const std::string& scratch_dir() {
  static const std::string dir = [] {
    auto d = std::filesystem::temp_directory_path() / ("colossal-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d.string();
  }();
  return dir;
}

void write_bytes(const std::string& path, const uint8_t* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
}

}  // namespace colossal::fuzz
