// What every fuzz target shares: an input is either accepted or rejected with colossal::Error (the
// one-line, file-and-key message a user sees). Anything else escaping a parser - a library's own
// exception, an out-of-range read, a crash - is a finding: `reject_only` lets colossal::Error pass
// and aborts on every other exception, so libFuzzer (and the seed replay under ctest) reports it.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "src/core/error.h"

namespace colossal::fuzz {

template <typename F>
void reject_only(F&& parse) {
  try {
    parse();
  } catch (const Error&) {
    // a clear rejection: the expected outcome for malformed input
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz: an exception other than colossal::Error escaped: %s\n", e.what());
    std::abort();
  }
}

// A per-process scratch directory for targets whose parser reads files.
const std::string& scratch_dir();
void write_bytes(const std::string& path, const uint8_t* data, size_t size);

}  // namespace colossal::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
