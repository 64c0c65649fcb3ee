// IDX files: see idx.h.
#include "src/data/idx.h"

#include <zlib.h>

#include <cstdio>
#include <memory>

#include "src/core/error.h"

namespace colossal {

std::string read_maybe_gzip(const std::string& path, int64_t max_bytes) {
  // gzread reads plain files unchanged, so one path serves both forms.
  std::unique_ptr<gzFile_s, int (*)(gzFile)> f(gzopen(path.c_str(), "rb"), gzclose);
  if (!f) throw Error("file " + path + ": cannot be opened");
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const int n = gzread(f.get(), buf, sizeof buf);
    if (n < 0) {
      int code = 0;
      const char* why = gzerror(f.get(), &code);
      throw Error("file " + path + ": is not readable gzip data (" + std::string(why ? why : "zlib error") + ")");
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (static_cast<int64_t>(out.size()) > max_bytes)
      throw Error("file " + path + ": decompresses to more than " + std::to_string(max_bytes) + " bytes");
  }
  return out;
}

IdxArray parse_idx(const std::string& bytes, const std::string& label) {
  auto fail = [&](const std::string& why) -> IdxArray { throw Error("IDX file " + label + ": " + why); };
  if (bytes.size() < 4) return fail("is " + std::to_string(bytes.size()) + " bytes, shorter than the 4-byte header");
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(bytes[i]); };
  if (byte(0) != 0 || byte(1) != 0) return fail("does not start with two zero bytes (not an IDX file)");
  if (byte(2) != 0x08) {
    char type[8];
    std::snprintf(type, sizeof type, "0x%02x", byte(2));
    return fail("holds values of type " + std::string(type) + " (supported: 0x08, unsigned bytes, as image data sets use)");
  }
  const size_t rank = byte(3);
  if (rank < 1 || rank > 4) return fail("has " + std::to_string(rank) + " dimensions (valid: 1 to 4)");
  const size_t header = 4 + 4 * rank;
  if (bytes.size() < header) return fail("ends inside its dimensions (" + std::to_string(bytes.size()) + " bytes)");
  IdxArray a;
  uint64_t count = 1;
  for (size_t d = 0; d < rank; ++d) {
    const size_t at = 4 + 4 * d;
    const uint64_t n = (uint64_t{byte(at)} << 24) | (uint64_t{byte(at + 1)} << 16) | (uint64_t{byte(at + 2)} << 8) | byte(at + 3);
    count *= n;   // each factor < 2^32 and the running product is checked below, so no overflow
    if (count > bytes.size()) return fail("dimensions ask for more values than the file holds");
    a.dims.push_back(static_cast<int64_t>(n));
  }
  if (bytes.size() - header != count)
    return fail("holds " + std::to_string(bytes.size() - header) + " values but its dimensions say " + std::to_string(count));
  a.values.assign(bytes.begin() + static_cast<std::ptrdiff_t>(header), bytes.end());
  return a;
}

IdxArray read_idx(const std::string& path) { return parse_idx(read_maybe_gzip(path), path); }

}  // namespace colossal
