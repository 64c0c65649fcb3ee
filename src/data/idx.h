// IDX files, the format of MNIST and Fashion-MNIST (LeCun's): two zero bytes, a type byte (0x08:
// unsigned bytes, the only type image data sets use), a byte with the number of dimensions, the
// dimensions as big-endian uint32, then the values. Debian's dataset-fashion-mnist ships them
// gzip-compressed; both forms are read. A malformed file is an Error naming it and what is wrong,
// never a read past its end (tests/fuzz/fuzz_idx).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace colossal {

struct IdxArray {
  std::vector<int64_t> dims;
  std::vector<uint8_t> values;   // row-major, product(dims) of them
};

// The bytes of `path`, gunzipped when they are gzip data; at most `max_bytes` after decompression.
std::string read_maybe_gzip(const std::string& path, int64_t max_bytes = int64_t{1} << 31);
// An IDX array from its bytes; `label` names the file in errors.
IdxArray parse_idx(const std::string& bytes, const std::string& label);
IdxArray read_idx(const std::string& path);

}  // namespace colossal
