// Replays files through the fuzz targets without libFuzzer (the g++ build, so ctest checks every seed
// and regression input on any machine): `fuzz_replay TARGET PATH...`, each PATH a file or a directory
// of files. Every target is linked into this one program under its own name (tests/fuzz/CMakeLists.txt
// writes the table). Exits non-zero only if a target aborts, which ends the process anyway.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_target.h"

#define COLOSSAL_FUZZ_TARGET(name) extern "C" int colossal_fuzz_##name(const uint8_t* data, size_t size);
#include "fuzz_targets.inc"
#undef COLOSSAL_FUZZ_TARGET

namespace {

struct Target {
  const char* name;
  int (*run)(const uint8_t* data, size_t size);
};

const Target kTargets[] = {
#define COLOSSAL_FUZZ_TARGET(name) {#name, colossal_fuzz_##name},
#include "fuzz_targets.inc"
#undef COLOSSAL_FUZZ_TARGET
};

}  // namespace

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  const Target* target = nullptr;
  std::string names;
  for (const auto& t : kTargets) {
    names += std::string(names.empty() ? "" : ", ") + t.name;
    if (argc > 1 && std::strcmp(argv[1], t.name) == 0) target = &t;
  }
  if (!target) {
    std::fprintf(stderr, "replay: usage: %s TARGET PATH... (TARGET one of: %s)\n", argv[0], names.c_str());
    return 2;
  }
  std::vector<fs::path> files;
  for (int i = 2; i < argc; ++i) {
    const fs::path p(argv[i]);
    if (fs::is_directory(p)) {
      for (const auto& e : fs::directory_iterator(p))
        if (e.is_regular_file()) files.push_back(e.path());
    } else if (fs::is_regular_file(p)) {
      files.push_back(p);
    } else {
      std::fprintf(stderr, "replay: %s: no such file or directory\n", argv[i]);
      return 2;
    }
  }
  if (files.empty()) {
    std::fprintf(stderr, "replay: no inputs\n");
    return 2;
  }
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    target->run(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  }
  std::printf("replay: %s: %zu inputs, no finding\n", target->name, files.size());
  fs::remove_all(colossal::fuzz::scratch_dir());
  return 0;
}
