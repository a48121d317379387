// Tests for GgufWriter: byte layout checked against the GGUF spec by hand,
// argument validation, key replacement, alignment and the atomic file write.
#include "tools/testmodel/gguf_writer.h"

#include <dirent.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "src/gguf/gguf_reader.h"
#include "tests/testing/status_matchers.h"

namespace snapfill {
namespace {

using ::testing::HasSubstr;

template <typename T>
T Load(const std::string& bytes, size_t pos) {
  T v;
  std::memcpy(&v, bytes.data() + pos, sizeof(T));
  return v;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/gguf_writer_test_" + std::to_string(::getpid()) + "_" + name;
}

TEST(GgufWriterTest, EmptyFileIsHeaderPaddedToAlignment) {
  GgufWriter w;
  const std::string bytes = w.Serialize();
  // magic | u32 version | u64 n_tensors | u64 n_kv = 24 bytes, padded to 32.
  ASSERT_EQ(bytes.size(), 32u);
  EXPECT_EQ(bytes.substr(0, 4), "GGUF");
  EXPECT_EQ(Load<uint32_t>(bytes, 4), 3u);
  EXPECT_EQ(Load<uint64_t>(bytes, 8), 0u);
  EXPECT_EQ(Load<uint64_t>(bytes, 16), 0u);
  EXPECT_EQ(bytes.substr(24), std::string(8, '\0'));
}

TEST(GgufWriterTest, ScalarKvBytesMatchSpec) {
  GgufWriter w;
  w.AddUint32("a", 7);
  const std::string bytes = w.Serialize();
  // header (24) + key {u64 len = 1, 'a'} + u32 type 4 + u32 7 = 41 -> 64.
  ASSERT_EQ(bytes.size(), 64u);
  EXPECT_EQ(Load<uint64_t>(bytes, 16), 1u);  // n_kv
  EXPECT_EQ(Load<uint64_t>(bytes, 24), 1u);  // key length
  EXPECT_EQ(bytes[32], 'a');
  EXPECT_EQ(Load<uint32_t>(bytes, 33), 4u);  // GGUF_TYPE_UINT32
  EXPECT_EQ(Load<uint32_t>(bytes, 37), 7u);
}

TEST(GgufWriterTest, StringArrayBytesMatchSpec) {
  GgufWriter w;
  w.AddStringArray("k", {"ab", ""});
  const std::string bytes = w.Serialize();
  size_t p = 24 + 8 + 1;
  EXPECT_EQ(Load<uint32_t>(bytes, p), 9u);       // GGUF_TYPE_ARRAY
  EXPECT_EQ(Load<uint32_t>(bytes, p + 4), 8u);   // element type string
  EXPECT_EQ(Load<uint64_t>(bytes, p + 8), 2u);   // count
  EXPECT_EQ(Load<uint64_t>(bytes, p + 16), 2u);  // "ab"
  EXPECT_EQ(bytes.substr(p + 24, 2), "ab");
  EXPECT_EQ(Load<uint64_t>(bytes, p + 26), 0u);  // ""
}

TEST(GgufWriterTest, TensorDirectoryAndDataAreAligned) {
  GgufWriter w;
  std::vector<float> a = {1, 2, 3};  // 12 bytes: the next tensor must skip to 32
  SNAPFILL_ASSERT_OK(w.AddTensorF32("a", {3}, a));
  std::vector<float> b = {4, 5, 6, 7, 8, 9};
  SNAPFILL_ASSERT_OK(w.AddTensorF32("b", {3, 2}, b));
  const std::string bytes = w.Serialize();
  // Tensor info "a": name (8 + 1) | n_dims | ne[0] | type | offset.
  const size_t ia = 24;
  EXPECT_EQ(Load<uint32_t>(bytes, ia + 9), 1u);
  EXPECT_EQ(Load<int64_t>(bytes, ia + 13), 3);
  EXPECT_EQ(Load<uint32_t>(bytes, ia + 21), 0u);  // F32
  EXPECT_EQ(Load<uint64_t>(bytes, ia + 25), 0u);
  const size_t ib = ia + 33;
  EXPECT_EQ(Load<uint32_t>(bytes, ib + 9), 2u);
  EXPECT_EQ(Load<int64_t>(bytes, ib + 13), 3);
  EXPECT_EQ(Load<int64_t>(bytes, ib + 21), 2);
  EXPECT_EQ(Load<uint64_t>(bytes, ib + 33), 32u);  // 12 bytes rounded up to 32
  // The directory ends at 57 + 41 = 98 (9 + 4 + 16 + 4 + 8), so data starts at 128.
  const size_t start = 128;
  EXPECT_EQ(Load<float>(bytes, start), 1.0f);
  EXPECT_EQ(Load<float>(bytes, start + 8), 3.0f);
  EXPECT_EQ(Load<float>(bytes, start + 32), 4.0f);
  EXPECT_EQ(Load<float>(bytes, start + 32 + 20), 9.0f);
  EXPECT_EQ(bytes.size() % 32, 0u);
  EXPECT_EQ(bytes.size(), start + 32 + 32);
}

TEST(GgufWriterTest, SetAlignmentRecordsKeyAndPads) {
  GgufWriter w;
  SNAPFILL_ASSERT_OK(w.SetAlignment(64));
  SNAPFILL_ASSERT_OK(w.AddTensorF32("a", {1}, {1.0f}));
  SNAPFILL_ASSERT_OK(w.AddTensorF32("b", {1}, {2.0f}));
  const std::string bytes = w.Serialize();
  EXPECT_EQ(bytes.size() % 64, 0u);
  auto f = GgufFile::FromBytes(bytes);
  SNAPFILL_ASSERT_OK(f);
  EXPECT_EQ((*f)->alignment(), 64u);
  ASSERT_EQ((*f)->GetUint("general.alignment").value_or(0), 64u);
  EXPECT_EQ((*f)->FindTensor("b")->offset, 64u);

  EXPECT_EQ(w.SetAlignment(0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(w.SetAlignment(48).code(), absl::StatusCode::kInvalidArgument);
}

TEST(GgufWriterTest, AddingAKeyAgainReplacesItsValueInPlace) {
  GgufWriter w;
  w.AddUint32("x", 1);
  w.AddString("y", "keep");
  w.AddString("x", "two");
  EXPECT_EQ(w.num_kvs(), 2);
  auto f = GgufFile::FromBytes(w.Serialize());
  SNAPFILL_ASSERT_OK(f);
  ASSERT_EQ((*f)->metadata().size(), 2u);
  EXPECT_EQ((*f)->metadata()[0].key, "x");
  EXPECT_EQ((*f)->GetString("x").value_or(""), "two");
  EXPECT_EQ((*f)->GetString("y").value_or(""), "keep");
}

TEST(GgufWriterTest, AddValueRejectsMismatchedOrOutOfRangeValues) {
  GgufWriter w;
  // A string type holding an integer.
  absl::Status s =
      w.AddValue("k", GgufValue{GgufValueType::kString, GgufValueType::kUint8, uint64_t{1}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("'k'"));
  // 300 does not fit in uint8; -129 not in int8.
  s = w.AddValue("u8", GgufValue{GgufValueType::kUint8, GgufValueType::kUint8, uint64_t{300}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("300"));
  s = w.AddValue(
      "i8", GgufValue{GgufValueType::kArray, GgufValueType::kInt8, std::vector<int64_t>{1, -129}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  // Nested arrays and unknown ids.
  s = w.AddValue("n",
                 GgufValue{GgufValueType::kArray, GgufValueType::kArray, std::vector<uint64_t>{}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  s = w.AddValue("t",
                 GgufValue{static_cast<GgufValueType>(13), GgufValueType::kUint8, uint64_t{0}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(w.num_kvs(), 0);
  // The limits themselves are fine.
  SNAPFILL_EXPECT_OK(
      w.AddValue("u8", GgufValue{GgufValueType::kUint8, GgufValueType::kUint8, uint64_t{255}}));
  SNAPFILL_EXPECT_OK(w.AddValue("i8", GgufValue{GgufValueType::kArray, GgufValueType::kInt8,
                                                std::vector<int64_t>{-128, 127}}));
}

TEST(GgufWriterTest, AddTensorValidatesShapeTypeAndBytes) {
  GgufWriter w;
  const std::string four_floats(16, '\0');
  SNAPFILL_EXPECT_OK(w.AddTensor("ok", GgmlType::kF32, {2, 2}, four_floats));
  auto code = [&](std::string name, GgmlType t, std::vector<int64_t> shape, std::string data) {
    return w.AddTensor(name, t, shape, data).code();
  };
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  EXPECT_EQ(code("ok", GgmlType::kF32, {2, 2}, four_floats), kInvalid);  // duplicate
  EXPECT_EQ(code("a", GgmlType::kF32, {2, 2}, std::string(15, '\0')), kInvalid);
  EXPECT_EQ(code("b", static_cast<GgmlType>(77), {4}, four_floats), kInvalid);
  EXPECT_EQ(code("c", GgmlType::kF32, {}, ""), kInvalid);
  EXPECT_EQ(code("d", GgmlType::kF32, {1, 1, 1, 1, 4}, four_floats), kInvalid);
  EXPECT_EQ(code("e", GgmlType::kF32, {4, 0}, ""), kInvalid);
  EXPECT_EQ(code("f", GgmlType::kQ8_0, {16}, std::string(17, '\0')), kInvalid);  // half a block
  // One Q8_0 block row: 32 elements in 34 bytes.
  SNAPFILL_EXPECT_OK(w.AddTensor("g", GgmlType::kQ8_0, {32, 3}, std::string(3 * 34, '\x01')));
  EXPECT_EQ(w.num_tensors(), 2);
}

TEST(GgufWriterTest, VersionCanBeSetForFixtures) {
  GgufWriter w;
  w.set_version(2);
  EXPECT_EQ(Load<uint32_t>(w.Serialize(), 4), 2u);
}

TEST(GgufWriterTest, WriteFileWritesSerializeAtomically) {
  GgufWriter w;
  w.AddString("general.architecture", "llama");
  SNAPFILL_ASSERT_OK(w.AddTensorF32("t", {2}, {1.5f, -2.0f}));
  const std::string path = TempPath("atomic.gguf");
  {
    std::ofstream old(path, std::ios::binary);
    old << "previous contents";
  }
  SNAPFILL_ASSERT_OK(w.WriteFile(path));
  EXPECT_EQ(ReadAll(path), w.Serialize());
  // No temporary file is left next to it.
  const std::string dir = ::testing::TempDir();
  const std::string tmp_prefix = path.substr(dir.size() + (dir.back() == '/' ? 0 : 1)) + ".tmp.";
  DIR* d = opendir(dir.c_str());
  ASSERT_NE(d, nullptr);
  int leftovers = 0;
  while (dirent* e = readdir(d)) {
    if (std::string(e->d_name).rfind(tmp_prefix, 0) == 0) ++leftovers;
  }
  closedir(d);
  EXPECT_EQ(leftovers, 0);
  auto f = GgufFile::Open(path);
  SNAPFILL_ASSERT_OK(f);
  EXPECT_EQ((*f)->GetString("general.architecture").value_or(""), "llama");
  std::remove(path.c_str());
}

TEST(GgufWriterTest, WriteFileIntoMissingDirectoryFails) {
  GgufWriter w;
  const absl::Status s = w.WriteFile(TempPath("no/such/dir/x.gguf"));
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(s.message()), HasSubstr("no/such/dir"));
}

}  // namespace
}  // namespace snapfill
