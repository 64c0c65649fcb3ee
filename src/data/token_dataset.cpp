// HDF5 token dataset: see token_dataset.h. Uses the HDF5 C API directly; every failure becomes an
// Error naming the file and the object (HDF5's own stack printing is switched off).
#include "src/data/token_dataset.h"

#include <hdf5.h>
#include <unistd.h>

#include <filesystem>

#include "src/core/error.h"
#include "src/io/atomic_dir.h"

namespace colossal {
namespace {

// Closes an HDF5 handle with the right function when it leaves scope.
struct H5Handle {
  hid_t id;
  herr_t (*close)(hid_t);
  H5Handle(hid_t i, herr_t (*c)(hid_t)) : id(i), close(c) {}
  ~H5Handle() { if (id >= 0) close(id); }
  operator hid_t() const { return id; }
};

void quiet_hdf5() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

template <typename T>
void write_1d(hid_t group, const char* name, const std::vector<T>& data, hid_t type, const std::string& path) {
  hsize_t n = data.size();
  H5Handle space(H5Screate_simple(1, &n, nullptr), H5Sclose);
  H5Handle plist(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  if (n > 0) {
    hsize_t chunk = std::min<hsize_t>(n, 1 << 16);
    H5Pset_chunk(plist, 1, &chunk);
    H5Pset_shuffle(plist);
    H5Pset_deflate(plist, 4);
  }
  H5Handle ds(H5Dcreate2(group, name, type, space, H5P_DEFAULT, plist, H5P_DEFAULT), H5Dclose);
  if (ds < 0 || (n > 0 && H5Dwrite(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()) < 0))
    throw Error("dataset " + path + ": cannot write " + name);
}

template <typename T>
std::vector<T> read_1d(hid_t file, const std::string& name, hid_t type, const std::string& path) {
  H5Handle ds(H5Dopen2(file, name.c_str(), H5P_DEFAULT), H5Dclose);
  if (ds < 0) throw Error("dataset " + path + ": missing " + name + " (not a colossal dataset? rebuild with `colossal data prepare`)");
  H5Handle space(H5Dget_space(ds), H5Sclose);
  if (H5Sget_simple_extent_ndims(space) != 1) throw Error("dataset " + path + ": " + name + " is not 1-D");
  hsize_t n = 0;
  H5Sget_simple_extent_dims(space, &n, nullptr);
  std::vector<T> out(n);
  if (n > 0 && H5Dread(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()) < 0)
    throw Error("dataset " + path + ": cannot read " + name + " (file corrupt?)");
  return out;
}

H5Handle open_file(const std::string& path) {
  quiet_hdf5();
  if (!std::filesystem::is_regular_file(path))
    throw Error("dataset " + path + ": no such file (build it with `colossal data prepare`)");
  H5Handle f(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (f < 0) throw Error("dataset " + path + ": not an HDF5 file");
  return f;
}

}  // namespace

void TokenSplit::append_document(const std::vector<int>& ids, int eos) {
  tokens.insert(tokens.end(), ids.begin(), ids.end());
  tokens.push_back(eos);
  doc_offsets.push_back(static_cast<int64_t>(tokens.size()));
}

void write_token_dataset(const std::string& path, const TokenSplit& train, const TokenSplit& val,
                         int64_t vocab_size, const std::string& tokenizer_fingerprint) {
  quiet_hdf5();
  prepare_output_file(path, "dataset output");
  std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  try {
    H5Handle f(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
    if (f < 0) throw Error("dataset " + path + ": cannot create file");
    for (auto [name, split] : {std::pair{"train", &train}, std::pair{"val", &val}}) {
      H5Handle g(H5Gcreate2(f, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
      write_1d(g, "tokens", split->tokens, H5T_NATIVE_INT32, path);
      write_1d(g, "doc_offsets", split->doc_offsets, H5T_NATIVE_INT64, path);
    }
    H5Handle scalar(H5Screate(H5S_SCALAR), H5Sclose);
    H5Handle a(H5Acreate2(f, "vocab_size", H5T_NATIVE_INT64, scalar, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
    H5Awrite(a, H5T_NATIVE_INT64, &vocab_size);
    H5Handle str(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(str, tokenizer_fingerprint.size() + 1);
    H5Handle b(H5Acreate2(f, "tokenizer_fingerprint", str, scalar, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
    H5Awrite(b, str, tokenizer_fingerprint.c_str());
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);   // a failed write leaves nothing behind
    throw;
  }
  if (const std::string reason = move_into_place(tmp, path); !reason.empty())
    throw Error("dataset " + path + ": cannot move it into place (" + reason + ")");
}

TokenDatasetInfo read_token_dataset_info(const std::string& path) {
  H5Handle f = open_file(path);
  TokenDatasetInfo info;
  H5Handle a(H5Aopen(f, "vocab_size", H5P_DEFAULT), H5Aclose);
  if (a < 0 || H5Aread(a, H5T_NATIVE_INT64, &info.vocab_size) < 0)
    throw Error("dataset " + path + ": missing attribute vocab_size (not a colossal dataset?)");
  H5Handle b(H5Aopen(f, "tokenizer_fingerprint", H5P_DEFAULT), H5Aclose);
  if (b >= 0) {
    H5Handle type(H5Aget_type(b), H5Tclose);
    std::string s(H5Tget_size(type), '\0');
    H5Handle mem(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(mem, s.size());
    if (H5Aread(b, mem, s.data()) >= 0) info.tokenizer_fingerprint = s.c_str();
  }
  for (auto [name, out] : {std::pair{"/train/tokens", &info.train_tokens}, std::pair{"/val/tokens", &info.val_tokens}}) {
    H5Handle ds(H5Dopen2(f, name, H5P_DEFAULT), H5Dclose);
    if (ds < 0) throw Error("dataset " + path + ": missing " + name);
    H5Handle space(H5Dget_space(ds), H5Sclose);
    hsize_t n = 0;
    H5Sget_simple_extent_dims(space, &n, nullptr);
    *out = static_cast<int64_t>(n);
  }
  return info;
}

TokenSplit read_token_split(const std::string& path, const std::string& split) {
  H5Handle f = open_file(path);
  TokenSplit s;
  s.tokens = read_1d<int32_t>(f, "/" + split + "/tokens", H5T_NATIVE_INT32, path);
  s.doc_offsets = read_1d<int64_t>(f, "/" + split + "/doc_offsets", H5T_NATIVE_INT64, path);
  if (s.doc_offsets.empty() || s.doc_offsets.back() != static_cast<int64_t>(s.tokens.size()))
    throw Error("dataset " + path + ": /" + split + "/doc_offsets does not match its tokens (file corrupt?)");
  return s;
}

}  // namespace colossal
