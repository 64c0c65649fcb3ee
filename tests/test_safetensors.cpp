// safetensors: round trips of dtypes, shapes and metadata, and rejection of every kind of damaged
// file with a message naming the file (never a crash or a wrong tensor).
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <filesystem>
#include <fstream>
#include <functional>

#include "src/core/error.h"
#include "src/io/hf_weights.h"
#include "src/io/safetensors.h"
#include "tests/support/test_support.h"

using namespace colossal;
using colossal::test::TempDir;

namespace {

std::string load_error(const std::string& path) {
  try {
    load_safetensors(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// A file with the given header text and `data_bytes` zero bytes after it.
void write_raw(const std::string& path, const std::string& header, size_t data_bytes, uint64_t claimed_len = 0) {
  std::ofstream out(path, std::ios::binary);
  uint64_t n = claimed_len ? claimed_len : header.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>(n >> (8 * i)));
  out << header << std::string(data_bytes, '\0');
}

}  // namespace

TEST(Safetensors, RoundTripsDtypesShapesAndMetadata) {
  TempDir dir;
  std::vector<NamedTensor> in = {
      {"w", at::randn({3, 5})},
      {"d", at::randn({2}, at::kDouble)},
      {"h", at::randn({4, 1, 2}).to(at::kHalf)},
      {"b", at::randn({7}).to(at::kBFloat16)},
      {"i", at::arange(10, at::kLong)},
      {"u", at::arange(6, at::kByte).view({2, 3})},
      {"scalar", at::scalar_tensor(3.5)},
      {"empty", at::empty({0, 4})},
      {"strided", at::randn({4, 6}).t()},   // non-contiguous input is written contiguous
  };
  save_safetensors(dir / "t.safetensors", in, {{"format", "pt"}, {"step", "7"}});
  auto out = load_safetensors(dir / "t.safetensors");
  ASSERT_EQ(out.tensors.size(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(out.tensors[i].name, in[i].name);   // file order is write order
    EXPECT_EQ(out.tensors[i].tensor.scalar_type(), in[i].tensor.scalar_type());
    EXPECT_TRUE(at::equal(out.tensors[i].tensor, in[i].tensor.contiguous())) << in[i].name;
  }
  EXPECT_EQ(out.metadata.at("step"), "7");
}

// The streaming writer behind checkpoints: the header first, then one tensor at a time in its order.
// A tensor out of order, of another shape or dtype, or one never written is an Error, not a file whose
// header lies about its data.
TEST(Safetensors, TheWriterTakesTensorsOneAtATimeInItsHeadersOrderOnly) {
  TempDir dir;
  const std::vector<SafetensorsWriter::Entry> entries = {{"a", at::kFloat, {2, 3}}, {"b", at::kHalf, {4}}};
  {
    SafetensorsWriter w(dir / "ok.safetensors", entries, {{"format", "pt"}});
    const at::Tensor a = at::randn({3, 2}).t();   // any strides
    w.write("a", a);
    w.write("b", at::ones({4}, at::kHalf));
    w.finish();
    auto f = load_safetensors(dir / "ok.safetensors");
    EXPECT_TRUE(at::equal(f.at("a", "ok"), a.contiguous()));
    EXPECT_EQ(f.metadata.at("format"), "pt");
  }
  auto fails = [&](const std::function<void(SafetensorsWriter&)>& use) {
    SafetensorsWriter w(dir / "bad.safetensors", entries);
    try {
      use(w);
      w.finish();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("bad.safetensors"), std::string::npos) << e.what();
      return true;
    }
    return false;
  };
  EXPECT_TRUE(fails([](SafetensorsWriter& w) { w.write("b", at::ones({4}, at::kHalf)); }));          // out of order
  EXPECT_TRUE(fails([](SafetensorsWriter& w) { w.write("a", at::ones({3, 2})); }));                  // another shape
  EXPECT_TRUE(fails([](SafetensorsWriter& w) { w.write("a", at::ones({2, 3}, at::kDouble)); }));     // another dtype
  EXPECT_TRUE(fails([](SafetensorsWriter& w) { w.write("a", at::ones({2, 3})); }));                  // "b" never written
}

// save_pretrained's sharding, one tensor at a time: files cut between tensors at the size limit (a
// tensor above it alone in its file), transformers' names and index, read back as one model; one file
// and no index when everything fits.
TEST(Safetensors, TheShardedWriterCutsFilesBetweenTensorsAndIndexesThem) {
  TempDir dir;
  // 400, 400, 1200 and 40 bytes under a 1000-byte limit: [a, b], [c], [d]
  const std::vector<NamedTensor> in = {{"a", at::randn({100})}, {"b", at::randn({10, 10})}, {"c", at::randn({300})},
                                       {"d", at::arange(40, at::kByte)}};
  std::vector<SafetensorsWriter::Entry> entries;
  for (const auto& t : in) entries.push_back({t.name, t.tensor.scalar_type(), t.tensor.sizes().vec()});
  ShardedSafetensorsWriter w(dir.path(), "model", entries, 1000, {{"format", "pt"}});
  EXPECT_EQ(w.files(), (std::vector<std::string>{"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                                                 "model-00003-of-00003.safetensors"}));
  for (const auto& t : in) w.write(t.name, t.tensor);
  w.finish();
  const auto index = test::read_json_file(dir / "model.safetensors.index.json");
  EXPECT_EQ(index["weight_map"]["b"], "model-00001-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["c"], "model-00002-of-00003.safetensors");
  EXPECT_EQ(index["metadata"]["total_size"], 2040);
  EXPECT_EQ(load_safetensors(dir / "model-00003-of-00003.safetensors").tensors.size(), 1u);
  const auto weights = HfWeights::open(dir.path());
  for (const auto& t : in) EXPECT_TRUE(at::equal(weights.get(t.name), t.tensor)) << t.name;

  TempDir one;
  ShardedSafetensorsWriter whole(one.path(), "model", entries, 1 << 20);
  for (const auto& t : in) whole.write(t.name, t.tensor);
  whole.finish();
  EXPECT_EQ(whole.files(), std::vector<std::string>{"model.safetensors"});
  EXPECT_FALSE(std::filesystem::exists(one / "model.safetensors.index.json"));
  // Out of order across a cut is refused as within one file.
  TempDir bad;
  ShardedSafetensorsWriter order(bad.path(), "model", entries, 1000);
  order.write("a", in[0].tensor);
  EXPECT_THROW(order.write("c", in[2].tensor), Error);
}

TEST(Safetensors, DataSectionStartsEightByteAligned) {
  TempDir dir;
  save_safetensors(dir / "a.safetensors", {{"x", at::ones({3})}});
  std::ifstream in(dir / "a.safetensors", std::ios::binary);
  unsigned char len[8];
  in.read(reinterpret_cast<char*>(len), 8);
  EXPECT_EQ(len[0] % 8, 0);
}

TEST(Safetensors, RejectsHeaderLongerThanFile) {
  TempDir dir;
  write_raw(dir / "f", "{}", 0, 851443712);
  std::string e = load_error(dir / "f");
  EXPECT_NE(e.find("header claims 851443712 bytes (812.00 MiB) but the file has 2 bytes"), std::string::npos) << e;
}

TEST(Safetensors, RejectsFileShorterThanLengthField) {
  TempDir dir;
  colossal::test::write_file(dir / "f", "abc");
  EXPECT_NE(load_error(dir / "f").find("too short for a safetensors header"), std::string::npos);
}

TEST(Safetensors, RejectsTruncatedData) {
  TempDir dir;
  save_safetensors(dir / "t", {{"x", at::ones({1000})}});
  std::string content = colossal::test::read_file(dir / "t");
  colossal::test::write_file(dir / "t", content.substr(0, content.size() - 100));
  std::string e = load_error(dir / "t");
  EXPECT_NE(e.find("tensor \"x\" lies outside the file"), std::string::npos) << e;
}

TEST(Safetensors, RejectsInvalidJson) {
  TempDir dir;
  write_raw(dir / "f", "{\"x\": {\"dtype\": ", 16);
  EXPECT_NE(load_error(dir / "f").find("header is not valid JSON"), std::string::npos);
}

TEST(Safetensors, RejectsShapeThatDisagreesWithByteCount) {
  TempDir dir;
  write_raw(dir / "f", R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8);
  EXPECT_NE(load_error(dir / "f").find("has 8 bytes but its shape needs 12"), std::string::npos);
}

TEST(Safetensors, RejectsOverlappingTensors) {
  TempDir dir;
  write_raw(dir / "f", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12);
  EXPECT_NE(load_error(dir / "f").find("overlap"), std::string::npos);
}

TEST(Safetensors, RejectsUnknownDtypeAndMissingFields) {
  TempDir dir;
  write_raw(dir / "f", R"({"a":{"dtype":"F128","shape":[1],"data_offsets":[0,16]}})", 16);
  EXPECT_NE(load_error(dir / "f").find("unsupported dtype F128"), std::string::npos);
  write_raw(dir / "g", R"({"a":{"dtype":"F32","shape":[1]}})", 4);
  EXPECT_NE(load_error(dir / "g").find("tensor \"a\" has no \"data_offsets\""), std::string::npos) << load_error(dir / "g");
  write_raw(dir / "h", R"({"a":{"dtype":7,"shape":[1],"data_offsets":[0,4]}})", 4);
  EXPECT_NE(load_error(dir / "h").find("has dtype 7, not a name"), std::string::npos) << load_error(dir / "h");
  write_raw(dir / "i", R"({"a":[1,2]})", 4);
  EXPECT_NE(load_error(dir / "i").find("tensor \"a\" has no \"dtype\""), std::string::npos) << load_error(dir / "i");
}

TEST(Safetensors, RejectsShapesThatAreNotWholeOrOverflowSixtyFourBits) {
  TempDir dir;
  auto error_for = [&](const std::string& shape, const std::string& offsets = "[0,4]") {
    write_raw(dir / "f", R"({"x":{"dtype":"F32","shape":)" + shape + R"(,"data_offsets":)" + offsets + "}}", 4);
    return load_error(dir / "f");
  };
  EXPECT_NE(error_for("[1024.5]").find("tensor \"x\" has shape entry 1024.5 (sizes are whole numbers >= 0)"), std::string::npos)
      << error_for("[1024.5]");
  EXPECT_NE(error_for("[-1]").find("shape entry -1"), std::string::npos) << error_for("[-1]");
  EXPECT_NE(error_for("[\"4\"]").find("shape entry \"4\""), std::string::npos) << error_for("[\"4\"]");
  EXPECT_NE(error_for("4").find("has shape 4, not a list of sizes"), std::string::npos) << error_for("4");
  // 2^62 floats are 2^64 bytes: one past what a 64-bit size holds.
  EXPECT_NE(error_for("[4611686018427387904]").find("whose byte size does not fit 64 bits"), std::string::npos)
      << error_for("[4611686018427387904]");
  EXPECT_NE(error_for("[65536,65536,65536,65536]").find("does not fit 64 bits"), std::string::npos);
  EXPECT_NE(error_for("[1]", "[0.5,4]").find("data_offsets [0.5,4] (expected [begin, end], whole numbers >= 0)"),
            std::string::npos) << error_for("[1]", "[0.5,4]");
  EXPECT_NE(error_for("[1]", "[-4,0]").find("data_offsets [-4,0]"), std::string::npos);
  EXPECT_EQ(error_for("[1]"), "(no error)");
  EXPECT_EQ(error_for("[0,7]", "[0,0]"), "(no error)");   // empty tensors are fine
}

TEST(Safetensors, RejectsNumbersBeyondJsonsRange) {
  TempDir dir;
  write_raw(dir / "f", R"({"x":{"dtype":"F32","shape":[1e999],"data_offsets":[0,4]}})", 4);
  EXPECT_NE(load_error(dir / "f").find("header is not valid JSON (a number out of range)"), std::string::npos) << load_error(dir / "f");
}

TEST(Safetensors, RejectsMetadataThatIsNotStrings) {
  TempDir dir;
  write_raw(dir / "f", R"({"__metadata__":{"step":5}})", 0);
  EXPECT_NE(load_error(dir / "f").find("__metadata__[\"step\"] is 5, not a string"), std::string::npos) << load_error(dir / "f");
  write_raw(dir / "g", R"({"__metadata__":[1]})", 0);
  EXPECT_NE(load_error(dir / "g").find("__metadata__ is not a JSON object of strings"), std::string::npos);
}

TEST(Safetensors, MissingFileIsAnError) {
  EXPECT_NE(load_error("/nonexistent/model.safetensors").find("no such file"), std::string::npos);
}

TEST(TorchSaveArchive, ACentralDirectoryOutsideTheFileOrNoEndRecordIsRefusedBeforeTorchReadsIt) {
  test::TempDir dir;
  auto error = [&](const std::string& bytes) {
    test::write_file(dir / "w.bin", bytes);
    try {
      load_torch_state_dict(dir / "w.bin");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  // An end record at the very end whose central directory (100 bytes at offset 1000) is past the end.
  std::string end_record("PK\x05\x06", 4);
  end_record += std::string(6, '\0') + std::string("\x01\x00", 2);                       // disks, entries
  end_record += std::string("\x64\x00\x00\x00", 4) + std::string("\xe8\x03\x00\x00", 4);   // size 100, offset 1000
  end_record += std::string(2, '\0');                                                      // no comment
  std::string e = error(std::string(40, 'x') + end_record);
  EXPECT_NE(e.find("truncated or damaged: its central directory (100 bytes at 1000) lies outside the 62 bytes"), std::string::npos) << e;
  e = error(std::string(40, 'x') + end_record + "trailing");   // the end record is not at the end: truncated
  EXPECT_NE(e.find("no end-of-central-directory record at the end"), std::string::npos) << e;
  e = error("PK");
  EXPECT_NE(e.find("shorter than a zip archive's end record"), std::string::npos) << e;
}
