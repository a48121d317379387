// Tests for the GGUF reader: writer -> reader round trips of every value type,
// the real model (when present), and malformed inputs, each of which must
// return the right code and a message naming the problem, never crash.
#include "src/gguf/gguf_reader.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "src/base/sys_stats.h"
#include "tools/testmodel/gguf_writer.h"
#include "tests/testing/files.h"
#include "tests/testing/status_matchers.h"
#include "tools/cli/environment.h"

namespace snapfill {
namespace {

using ::testing::HasSubstr;

template <typename T>
std::string Message(const absl::StatusOr<T>& s) {
  return std::string(s.status().message());
}

template <typename T>
void Store(std::string& bytes, size_t pos, T v) {
  ASSERT_LE(pos + sizeof(T), bytes.size());
  std::memcpy(bytes.data() + pos, &v, sizeof(T));
}
template <typename T>
T Load(const std::string& bytes, size_t pos) {
  T v;
  std::memcpy(&v, bytes.data() + pos, sizeof(T));
  return v;
}

// Returns the offset just past the GGUF string `s` (u64 length + bytes) in
// `bytes`; names in the fixtures are unique, so the first match is the one.
size_t After(const std::string& bytes, const std::string& s) {
  std::string encoded(8, '\0');
  const uint64_t n = s.size();
  std::memcpy(encoded.data(), &n, 8);
  encoded += s;
  const size_t pos = bytes.find(encoded);
  EXPECT_NE(pos, std::string::npos) << s;
  return pos == std::string::npos ? 0 : pos + encoded.size();
}

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/gguf_reader_test_" + std::to_string(::getpid()) + "_" + name;
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A small valid file: three KVs and two tensors, "wa" F32 [4, 2] (32 bytes)
// and "wb" Q8_0 [32, 1] (34 bytes, so its data ends before the final padding).
std::string SmallFile() {
  GgufWriter w;
  w.AddUint32("ka", 7);
  w.AddString("kb", "hi");
  w.AddInt32Array("arr", {1, -2});
  std::vector<float> wa = {0, 1, 2, 3, 4, 5, 6, 7};
  EXPECT_TRUE(w.AddTensorF32("wa", {4, 2}, wa).ok());
  std::string wb(34, '\0');
  for (int i = 0; i < 34; ++i) wb[i] = static_cast<char>(i);
  EXPECT_TRUE(w.AddTensor("wb", GgmlType::kQ8_0, {32, 1}, wb).ok());
  return w.Serialize();
}

// ---------------------------------------------------------------------------
// Round trips.

TEST(GgufReaderTest, RoundTripsEveryScalarType) {
  GgufWriter w;
  using T = GgufValueType;
  auto add = [&](const char* key, GgufValue v) { SNAPFILL_ASSERT_OK(w.AddValue(key, v)); };
  add("u8", {T::kUint8, T::kUint8, uint64_t{255}});
  add("i8", {T::kInt8, T::kUint8, int64_t{-128}});
  add("u16", {T::kUint16, T::kUint8, uint64_t{65535}});
  add("i16", {T::kInt16, T::kUint8, int64_t{-32768}});
  add("u32", {T::kUint32, T::kUint8, uint64_t{4000000000u}});
  add("i32", {T::kInt32, T::kUint8, int64_t{-2000000000}});
  add("f32", {T::kFloat32, T::kUint8, double{0.1f}});
  add("bool", {T::kBool, T::kUint8, true});
  add("str", {T::kString, T::kUint8, std::string("h\0llo", 5)});
  add("u64", {T::kUint64, T::kUint8, std::numeric_limits<uint64_t>::max()});
  add("i64", {T::kInt64, T::kUint8, std::numeric_limits<int64_t>::min()});
  add("f64", {T::kFloat64, T::kUint8, 0.1});
  auto f = GgufFile::FromBytes(w.Serialize());
  SNAPFILL_ASSERT_OK(f);
  const GgufFile& g = **f;
  ASSERT_EQ(g.metadata().size(), 12u);
  EXPECT_EQ(g.version(), 3u);

  auto check = [&](const char* key, T type) {
    const GgufValue* v = g.Find(key);
    EXPECT_NE(v, nullptr) << key;
    if (v == nullptr) return v;
    EXPECT_EQ(v->type, type) << key;
    EXPECT_EQ(v->size(), 1u) << key;
    return v;
  };
  EXPECT_EQ(std::get<uint64_t>(check("u8", T::kUint8)->value), 255u);
  EXPECT_EQ(std::get<int64_t>(check("i8", T::kInt8)->value), -128);
  EXPECT_EQ(std::get<uint64_t>(check("u16", T::kUint16)->value), 65535u);
  EXPECT_EQ(std::get<int64_t>(check("i16", T::kInt16)->value), -32768);
  EXPECT_EQ(std::get<uint64_t>(check("u32", T::kUint32)->value), 4000000000u);
  EXPECT_EQ(std::get<int64_t>(check("i32", T::kInt32)->value), -2000000000);
  EXPECT_EQ(std::get<double>(check("f32", T::kFloat32)->value), double{0.1f});
  EXPECT_EQ(std::get<bool>(check("bool", T::kBool)->value), true);
  EXPECT_EQ(std::get<std::string>(check("str", T::kString)->value), std::string("h\0llo", 5));
  EXPECT_EQ(std::get<uint64_t>(check("u64", T::kUint64)->value),
            std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(std::get<int64_t>(check("i64", T::kInt64)->value), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(std::get<double>(check("f64", T::kFloat64)->value), 0.1);
}

TEST(GgufReaderTest, RoundTripsArraysOfEveryElementType) {
  GgufWriter w;
  using T = GgufValueType;
  const std::vector<uint64_t> u = {0, 1, 200};
  const std::vector<int64_t> s = {-100, 0, 100};
  const std::vector<double> d = {0.5, -1.25, 3.0};
  const std::vector<bool> b = {true, false, true};
  const std::vector<std::string> strs = {"a", "", "ccc"};
  for (T t : {T::kUint8, T::kUint16, T::kUint32, T::kUint64}) {
    SNAPFILL_ASSERT_OK(w.AddValue(GgufValueTypeName(t), {T::kArray, t, u}));
  }
  for (T t : {T::kInt8, T::kInt16, T::kInt32, T::kInt64}) {
    SNAPFILL_ASSERT_OK(w.AddValue(GgufValueTypeName(t), {T::kArray, t, s}));
  }
  for (T t : {T::kFloat32, T::kFloat64}) {
    SNAPFILL_ASSERT_OK(w.AddValue(GgufValueTypeName(t), {T::kArray, t, d}));
  }
  SNAPFILL_ASSERT_OK(w.AddValue("bool", {T::kArray, T::kBool, b}));
  SNAPFILL_ASSERT_OK(w.AddValue("string", {T::kArray, T::kString, strs}));
  SNAPFILL_ASSERT_OK(w.AddValue("empty", {T::kArray, T::kUint32, std::vector<uint64_t>{}}));
  auto f = GgufFile::FromBytes(w.Serialize());
  SNAPFILL_ASSERT_OK(f);
  const GgufFile& g = **f;
  auto arr = [&](const char* key, T elem) -> const GgufValue& {
    const GgufValue* v = g.Find(key);
    static const GgufValue kNone{};
    EXPECT_NE(v, nullptr) << key;
    if (v == nullptr) return kNone;
    EXPECT_EQ(v->type, T::kArray) << key;
    EXPECT_EQ(v->array_type, elem) << key;
    return *v;
  };
  for (T t : {T::kUint8, T::kUint16, T::kUint32, T::kUint64}) {
    const GgufValue& v = arr(GgufValueTypeName(t), t);
    EXPECT_EQ(std::get<std::vector<uint64_t>>(v.value), u);
    EXPECT_EQ(v.size(), 3u);
  }
  for (T t : {T::kInt8, T::kInt16, T::kInt32, T::kInt64}) {
    EXPECT_EQ(std::get<std::vector<int64_t>>(arr(GgufValueTypeName(t), t).value), s);
  }
  for (T t : {T::kFloat32, T::kFloat64}) {
    EXPECT_EQ(std::get<std::vector<double>>(arr(GgufValueTypeName(t), t).value), d);
  }
  EXPECT_EQ(std::get<std::vector<bool>>(arr("bool", T::kBool).value), b);
  EXPECT_EQ(std::get<std::vector<std::string>>(arr("string", T::kString).value), strs);
  EXPECT_EQ(arr("empty", T::kUint32).size(), 0u);

  // Typed array getters convert between widths where the values fit.
  EXPECT_EQ(g.GetStringArray("string").value(), strs);
  EXPECT_EQ(g.GetIntArray("uint16").value(), (std::vector<int64_t>{0, 1, 200}));
  EXPECT_EQ(g.GetIntArray("int8").value(), s);
  EXPECT_EQ(g.GetFloatArray("float32").value(), (std::vector<float>{0.5f, -1.25f, 3.0f}));
  EXPECT_EQ(g.GetFloatArray("int32").value(), (std::vector<float>{-100, 0, 100}));
  EXPECT_EQ(g.GetIntArray("float32").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(g.GetStringArray("uint8").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(GgufReaderTest, TypedGettersConvertOrExplain) {
  GgufWriter w;
  w.AddUint32("u", 42);
  w.AddInt32("neg", -5);
  w.AddUint64("big", std::numeric_limits<uint64_t>::max());
  w.AddFloat32("f", 1.5f);
  w.AddBool("b", true);
  w.AddString("s", "text");
  auto f = GgufFile::FromBytes(w.Serialize());
  SNAPFILL_ASSERT_OK(f);
  const GgufFile& g = **f;
  EXPECT_EQ(g.GetUint("u").value(), 42u);
  EXPECT_EQ(g.GetInt("u").value(), 42);
  EXPECT_EQ(g.GetFloat("u").value(), 42.0);
  EXPECT_EQ(g.GetInt("neg").value(), -5);
  EXPECT_EQ(g.GetFloat("neg").value(), -5.0);
  EXPECT_EQ(g.GetFloat("f").value(), 1.5);
  EXPECT_EQ(g.GetBool("b").value(), true);
  EXPECT_EQ(g.GetString("s").value(), "text");
  EXPECT_TRUE(g.Has("s"));
  EXPECT_FALSE(g.Has("missing"));

  auto neg = g.GetUint("neg");
  EXPECT_EQ(neg.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(neg), HasSubstr("-5"));
  EXPECT_EQ(g.GetInt("big").status().code(), absl::StatusCode::kInvalidArgument);
  auto wrong = g.GetString("u");
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(wrong), HasSubstr("'u'"));
  EXPECT_THAT(Message(wrong), HasSubstr("uint32"));
  EXPECT_THAT(Message(wrong), HasSubstr("string"));
  EXPECT_EQ(g.GetUint("f").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(g.GetBool("u").status().code(), absl::StatusCode::kInvalidArgument);
  auto missing = g.GetUint("missing");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(missing), HasSubstr("missing"));
}

TEST(GgufReaderTest, TensorDirectoryRoundTrip) {
  const std::string bytes = SmallFile();
  auto f = GgufFile::FromBytes(bytes);
  SNAPFILL_ASSERT_OK(f);
  const GgufFile& g = **f;
  ASSERT_EQ(g.tensors().size(), 2u);
  EXPECT_EQ(g.alignment(), 32u);
  EXPECT_EQ(g.file_size(), bytes.size());
  const GgufTensorInfo* wa = g.FindTensor("wa");
  const GgufTensorInfo* wb = g.FindTensor("wb");
  ASSERT_NE(wa, nullptr);
  ASSERT_NE(wb, nullptr);
  EXPECT_EQ(g.FindTensor("wc"), nullptr);
  EXPECT_EQ(wa->type, GgmlType::kF32);
  EXPECT_EQ(wa->shape, (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(wa->num_elements(), 8);
  EXPECT_EQ(wa->size_bytes, 32u);
  EXPECT_EQ(wa->offset, 0u);
  float x[8];
  std::memcpy(x, wa->data, sizeof(x));
  for (int i = 0; i < 8; ++i) EXPECT_EQ(x[i], static_cast<float>(i));
  EXPECT_EQ(wb->type, GgmlType::kQ8_0);
  EXPECT_EQ(wb->shape, (std::vector<int64_t>{32, 1}));
  EXPECT_EQ(wb->size_bytes, 34u);  // one block: f16 scale + 32 int8
  EXPECT_EQ(wb->offset, 32u);
  for (int i = 0; i < 34; ++i) EXPECT_EQ(wb->data[i], i);
  // Data pointers are data_start + offset: header (24), KVs (18 + 24 + 35)
  // and directory (42 + 42) take 185 bytes, so the data section starts at 192.
  EXPECT_EQ(wb->data - wa->data, 32);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(wa->data) % 32, 0u);  // aligned in memory too
  EXPECT_EQ(Load<float>(bytes, 192 + 4), 1.0f);
  EXPECT_EQ(Load<uint8_t>(bytes, 224 + 33), 33);
}

TEST(GgufReaderTest, ReadsVersion2) {
  GgufWriter w;
  w.set_version(2);
  w.AddString("k", "v");
  auto f = GgufFile::FromBytes(w.Serialize());
  SNAPFILL_ASSERT_OK(f);
  EXPECT_EQ((*f)->version(), 2u);
  EXPECT_EQ((*f)->GetString("k").value(), "v");
}

TEST(GgufReaderTest, OpenMatchesFromBytes) {
  const std::string path = TempPath("small.gguf");
  const std::string bytes = SmallFile();
  WriteBytes(path, bytes);
  auto f = GgufFile::Open(path);
  SNAPFILL_ASSERT_OK(f);
  EXPECT_EQ((*f)->path(), path);
  EXPECT_EQ((*f)->file_size(), bytes.size());
  ASSERT_EQ((*f)->tensors().size(), 2u);
  EXPECT_EQ(std::memcmp((*f)->FindTensor("wb")->data, bytes.data() + 224, 34), 0);
  // Mapped data is aligned in memory as well as in the file.
  EXPECT_EQ(reinterpret_cast<uintptr_t>((*f)->FindTensor("wa")->data) % 32, 0u);
  std::remove(path.c_str());
}

// ---------------------------------------------------------------------------
// The real model.

// --model's resolution without the flag: $SNAPFILL_MODEL, else models/.
std::string RealModelPath() { return cli::ResolveModelPath(""); }

// ReleasePages gives a mapped tensor's pages back (the resident set drops)
// and the bytes read the same afterwards; an in-memory file keeps its bytes.
TEST(GgufReaderTest, ReleasedPagesReadTheSame) {
  const std::string path = RealModelPath();
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) GTEST_SKIP() << "real model not found at " << path;
  auto f = GgufFile::Open(path);
  SNAPFILL_ASSERT_OK(f);
  const GgufTensorInfo* emb = (*f)->FindTensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  const std::string before(reinterpret_cast<const char*>(emb->data), emb->size_bytes);  // maps every page in
  const uint64_t rss_before = CurrentRssBytes();
  const uint64_t released = (*f)->ReleasePages(emb->data, emb->size_bytes);
  const uint64_t rss_after = CurrentRssBytes();
  if (rss_before > 0) {  // the 30 MB left this process's resident set
    EXPECT_LE(rss_after + released * 9 / 10, rss_before) << rss_before << " -> " << rss_after;
  }
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  EXPECT_GE(released, emb->size_bytes - 2 * page);
  EXPECT_LE(released, emb->size_bytes);
  EXPECT_EQ(released % page, 0u);
  EXPECT_EQ(before, std::string(reinterpret_cast<const char*>(emb->data), emb->size_bytes));
  EXPECT_EQ((*f)->ReleasePages(emb->data, 100), 0u) << "no whole page in 100 bytes";

  auto mem = GgufFile::FromBytes(std::string((*f)->bytes()));
  SNAPFILL_ASSERT_OK(mem);
  const GgufTensorInfo* memb = (*mem)->FindTensor("token_embd.weight");
  ASSERT_NE(memb, nullptr);
  EXPECT_EQ((*mem)->ReleasePages(memb->data, memb->size_bytes), 0u);
  EXPECT_EQ(before, std::string(reinterpret_cast<const char*>(memb->data), memb->size_bytes));
}

// ReadAt copies the file's bytes with pread, mapping none of them; Populate
// maps a range whole; reads past the end are refused; an in-memory file
// copies from its bytes and has nothing to populate.
TEST(GgufReaderTest, ReadAtCopiesWithoutMappingAndPopulateMaps) {
  const std::string path = RealModelPath();
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) GTEST_SKIP() << "real model not found at " << path;
  auto f = GgufFile::Open(path);
  SNAPFILL_ASSERT_OK(f);
  ASSERT_GE((*f)->fd(), 0);
  const GgufTensorInfo* emb = (*f)->FindTensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  const uint64_t at = (*f)->OffsetOf(emb->data);
  // Only what parsing the header mapped around the tensor's start.
  const uint64_t before = testing::MappedResidentBytes(emb->data, emb->size_bytes);
  EXPECT_LT(before, emb->size_bytes / 8);
  std::string copy(emb->size_bytes, '\0');
  SNAPFILL_ASSERT_OK((*f)->ReadAt(at, copy.data(), copy.size()));
  EXPECT_EQ(testing::MappedResidentBytes(emb->data, emb->size_bytes), before) << "pread mapped pages";
  EXPECT_GE((*f)->Populate(emb->data, emb->size_bytes), emb->size_bytes);
  EXPECT_GE(testing::MappedResidentBytes(emb->data, emb->size_bytes), emb->size_bytes);
  EXPECT_EQ(copy, std::string(reinterpret_cast<const char*>(emb->data), emb->size_bytes));
  char byte;
  EXPECT_EQ((*f)->ReadAt((*f)->file_size(), &byte, 1).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ((*f)->ReadAt((*f)->file_size() - 1, &byte, 2).code(), absl::StatusCode::kOutOfRange);
  SNAPFILL_EXPECT_OK((*f)->ReadAt((*f)->file_size(), &byte, 0));

  auto mem = GgufFile::FromBytes(std::string((*f)->bytes()));
  SNAPFILL_ASSERT_OK(mem);
  EXPECT_EQ((*mem)->fd(), -1);
  const GgufTensorInfo* memb = (*mem)->FindTensor("token_embd.weight");
  std::string mem_copy(memb->size_bytes, '\0');
  SNAPFILL_ASSERT_OK((*mem)->ReadAt((*mem)->OffsetOf(memb->data), mem_copy.data(), mem_copy.size()));
  EXPECT_EQ(mem_copy, copy);
  EXPECT_EQ((*mem)->Populate(memb->data, memb->size_bytes), 0u);
}

TEST(GgufReaderTest, OpensTheRealModel) {
  const std::string path = RealModelPath();
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) GTEST_SKIP() << "real model not found at " << path;
  auto f = GgufFile::Open(path);
  SNAPFILL_ASSERT_OK(f);
  const GgufFile& g = **f;
  EXPECT_EQ(g.version(), 3u);
  EXPECT_EQ(g.tensors().size(), 272u);
  EXPECT_EQ(g.GetString("general.architecture").value(), "llama");
  EXPECT_EQ(g.GetUint("llama.block_count").value(), 30u);
  EXPECT_EQ(g.GetUint("llama.embedding_length").value(), 576u);
  EXPECT_EQ(g.GetStringArray("tokenizer.ggml.tokens").value().size(), 49152u);
  const GgufTensorInfo* emb = g.FindTensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->type, GgmlType::kQ8_0);
  EXPECT_EQ(emb->shape, (std::vector<int64_t>{576, 49152}));
  EXPECT_EQ(emb->size_bytes, 576u / 32 * 34 * 49152);
  const GgufTensorInfo* q = g.FindTensor("blk.29.attn_q.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->type, GgmlType::kQ4_1);
  // Every tensor lies inside the file.
  const uint8_t* base = emb->data - emb->offset;  // data section start
  for (const GgufTensorInfo& t : g.tensors()) {
    EXPECT_EQ(t.data, base + t.offset) << t.name;
    EXPECT_LE(static_cast<uint64_t>(t.data - base) + t.size_bytes, g.file_size()) << t.name;
  }
}

// ---------------------------------------------------------------------------
// Malformed inputs.

void ExpectError(const std::string& bytes, absl::StatusCode code,
                 const std::vector<std::string>& substrings) {
  auto f = GgufFile::FromBytes(bytes);
  ASSERT_FALSE(f.ok()) << "expected " << absl::StatusCodeToString(code);
  EXPECT_EQ(f.status().code(), code) << f.status();
  for (const std::string& s : substrings) EXPECT_THAT(Message(f), HasSubstr(s));
}

TEST(GgufReaderTest, RejectsBadMagic) {
  std::string bytes = SmallFile();
  bytes[3] = 'L';
  ExpectError(bytes, absl::StatusCode::kDataLoss, {"not a GGUF file", "'GGUL'"});
  ExpectError(std::string("\x01\x02\x03\x04 and more bytes that do not matter", 36),
              absl::StatusCode::kDataLoss, {"magic", "0x01020304"});
}

TEST(GgufReaderTest, RejectsEmptyInput) {
  ExpectError("", absl::StatusCode::kDataLoss, {"empty"});
  const std::string path = TempPath("empty.gguf");
  WriteBytes(path, "");
  auto f = GgufFile::Open(path);
  EXPECT_EQ(f.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(Message(f), HasSubstr(path));
  EXPECT_THAT(Message(f), HasSubstr("empty"));
  std::remove(path.c_str());
}

TEST(GgufReaderTest, EveryTruncationBeforeTheLastTensorEndFails) {
  const std::string bytes = SmallFile();
  // wb's 34 bytes start at 192 + 32 = 224; the rest up to 288 is padding.
  const size_t data_end = 224 + 34;
  ASSERT_EQ(bytes.size(), 288u);
  for (size_t n = 0; n < data_end; ++n) {
    auto f = GgufFile::FromBytes(bytes.substr(0, n));
    ASSERT_FALSE(f.ok()) << "prefix of " << n << " bytes parsed";
    EXPECT_EQ(f.status().code(), absl::StatusCode::kDataLoss) << n << ": " << f.status();
  }
  // Trailing padding after the last tensor is optional (llama.cpp checks each
  // tensor's bounds, not the padded total).
  for (size_t n = data_end; n <= bytes.size(); ++n) {
    SNAPFILL_EXPECT_OK(GgufFile::FromBytes(bytes.substr(0, n)));
  }
}

TEST(GgufReaderTest, TruncationMessagesSayWhatWasCut) {
  const std::string bytes = SmallFile();
  ExpectError(bytes.substr(0, 2), absl::StatusCode::kDataLoss, {"truncated"});
  ExpectError(bytes.substr(0, 20), absl::StatusCode::kDataLoss, {"truncated", "metadata count"});
  // Cut inside a string value: its length says 2 but 1 byte is left.
  GgufWriter w;
  w.AddString("kb", "hi");
  const std::string one_kv = w.Serialize();
  const size_t kb_value = After(one_kv, "kb") + 4;
  ExpectError(one_kv.substr(0, kb_value + 8 + 1), absl::StatusCode::kDataLoss,
              {"'kb'", "string length 2", "exceeds the 1 bytes left"});
  // Cut so early that the declared counts cannot fit.
  ExpectError(bytes.substr(0, 80), absl::StatusCode::kDataLoss, {"n_tensors = 2 cannot fit"});
  // Cut inside the tensor directory.
  ExpectError(bytes.substr(0, After(bytes, "wb") + 2), absl::StatusCode::kDataLoss,
              {"tensor wb", "truncated", "n_dims"});
}

TEST(GgufReaderTest, RejectsTensorDataPastTheEnd) {
  const std::string bytes = SmallFile();
  // Keep the directory intact but cut the data section inside wb.
  ExpectError(bytes.substr(0, 240), absl::StatusCode::kDataLoss,
              {"tensor wb: data ends at byte 258 but file has 240 bytes"});
  // Or point wb's offset far past the end.
  std::string far = bytes;
  Store<uint64_t>(far, After(far, "wb") + 4 + 16 + 4, 1024);
  ExpectError(far, absl::StatusCode::kDataLoss,
              {"tensor wb: data ends at byte 1250 but file has 288 bytes"});
}

TEST(GgufReaderTest, RejectsMisalignedOffset) {
  std::string bytes = SmallFile();
  Store<uint64_t>(bytes, After(bytes, "wb") + 4 + 16 + 4, 33);
  ExpectError(bytes, absl::StatusCode::kDataLoss, {"tensor wb", "offset 33", "alignment 32"});
}

TEST(GgufReaderTest, RejectsOverlappingTensors) {
  std::string bytes = SmallFile();
  Store<uint64_t>(bytes, After(bytes, "wb") + 4 + 16 + 4, 0);  // on top of wa
  ExpectError(bytes, absl::StatusCode::kDataLoss, {"overlap", "wa", "wb"});
}

TEST(GgufReaderTest, RejectsAbsurdCounts) {
  std::string bytes = SmallFile();
  Store<uint64_t>(bytes, 8, uint64_t{1} << 60);
  ExpectError(bytes, absl::StatusCode::kDataLoss, {"n_tensors = 1152921504606846976"});
  bytes = SmallFile();
  Store<uint64_t>(bytes, 16, ~uint64_t{0});
  ExpectError(bytes, absl::StatusCode::kDataLoss, {"n_kv = 18446744073709551615"});
  // A string length (the key of the first KV) larger than the file.
  bytes = SmallFile();
  Store<uint64_t>(bytes, 24, uint64_t{1} << 40);
  ExpectError(bytes, absl::StatusCode::kDataLoss, {"string length 1099511627776"});
  // An array length larger than the file.
  bytes = SmallFile();
  Store<uint64_t>(bytes, After(bytes, "arr") + 8, uint64_t{1} << 62);
  ExpectError(bytes, absl::StatusCode::kDataLoss,
              {"'arr'", "array length 4611686018427387904 cannot fit"});
  // A string length inside a string array.
  GgufWriter w;
  w.AddStringArray("sa", {"x"});
  bytes = w.Serialize();
  Store<uint64_t>(bytes, After(bytes, "sa") + 16, uint64_t{1} << 50);
  ExpectError(bytes, absl::StatusCode::kDataLoss, {"'sa'", "array element 0"});
}

TEST(GgufReaderTest, RejectsUnknownTensorTypeId) {
  std::string bytes = SmallFile();
  Store<uint32_t>(bytes, After(bytes, "wb") + 4 + 16, 77);
  ExpectError(bytes, absl::StatusCode::kUnimplemented, {"tensor wb", "unknown ggml type id 77"});
  // 4 and 5 are the removed Q4_2/Q4_3 ids: gaps in the table count as unknown.
  Store<uint32_t>(bytes, After(bytes, "wb") + 4 + 16, 4);
  ExpectError(bytes, absl::StatusCode::kUnimplemented, {"unknown ggml type id 4"});
}

TEST(GgufReaderTest, RejectsBadDimensions) {
  const std::string good = SmallFile();
  const size_t wb = After(good, "wb");
  std::string bytes = good;
  Store<uint32_t>(bytes, wb, 5);
  ExpectError(bytes, absl::StatusCode::kDataLoss, {"tensor wb", "n_dims = 5"});
  bytes = good;
  Store<uint32_t>(bytes, wb, 0);
  ExpectError(bytes, absl::StatusCode::kDataLoss, {"n_dims = 0"});
  bytes = good;
  Store<int64_t>(bytes, wb + 4 + 8, 0);
  ExpectError(bytes, absl::StatusCode::kDataLoss, {"tensor wb", "dimension 1 is 0"});
  bytes = good;
  Store<int64_t>(bytes, wb + 4, -32);
  ExpectError(bytes, absl::StatusCode::kDataLoss, {"dimension 0 is -32"});
  // ne[0] must hold whole Q8_0 blocks of 32.
  bytes = good;
  Store<int64_t>(bytes, wb + 4, 33);
  ExpectError(bytes, absl::StatusCode::kDataLoss, {"ne[0] = 33", "Q8_0 block size 32"});
  // Dimensions whose product overflows.
  bytes = good;
  Store<int64_t>(bytes, wb + 4, int64_t{1} << 40);
  Store<int64_t>(bytes, wb + 12, int64_t{1} << 40);
  ExpectError(bytes, absl::StatusCode::kDataLoss, {"tensor wb", "overflows"});
}

TEST(GgufReaderTest, RejectsDuplicateNamesAndKeys) {
  std::string bytes = SmallFile();
  bytes[After(bytes, "wb") - 1] = 'a';  // "wb" -> "wa"
  ExpectError(bytes, absl::StatusCode::kDataLoss, {"duplicate tensor name 'wa'"});
  bytes = SmallFile();
  bytes[After(bytes, "kb") - 1] = 'a';  // "kb" -> "ka"
  ExpectError(bytes, absl::StatusCode::kDataLoss, {"duplicate metadata key 'ka'"});
}

TEST(GgufReaderTest, RejectsUnsupportedVersions) {
  std::string bytes = SmallFile();
  Store<uint32_t>(bytes, 4, 1);
  ExpectError(bytes, absl::StatusCode::kUnimplemented, {"version 1", "expected version 2 or 3"});
  Store<uint32_t>(bytes, 4, 99);
  ExpectError(bytes, absl::StatusCode::kUnimplemented, {"version 99"});
  Store<uint32_t>(bytes, 4, 0x03000000);  // version 3 written big-endian
  ExpectError(bytes, absl::StatusCode::kUnimplemented, {"big-endian"});
}

TEST(GgufReaderTest, RejectsBadValueTypes) {
  std::string bytes = SmallFile();
  Store<uint32_t>(bytes, After(bytes, "ka"), 13);
  ExpectError(bytes, absl::StatusCode::kDataLoss, {"'ka'", "unknown value type id 13"});
  // An array whose elements are arrays.
  bytes = SmallFile();
  Store<uint32_t>(bytes, After(bytes, "arr") + 4, 9);
  ExpectError(bytes, absl::StatusCode::kUnimplemented, {"'arr'", "nested arrays"});
  bytes = SmallFile();
  Store<uint32_t>(bytes, After(bytes, "arr") + 4, 200);
  ExpectError(bytes, absl::StatusCode::kDataLoss, {"unknown array element type id 200"});
}

TEST(GgufReaderTest, RejectsBadAlignment) {
  for (uint32_t a : {0u, 3u, 48u}) {
    GgufWriter w;
    SNAPFILL_ASSERT_OK(w.AddValue("general.alignment",
                                  {GgufValueType::kUint32, GgufValueType::kUint8, uint64_t{a}}));
    ExpectError(w.Serialize(), absl::StatusCode::kDataLoss,
                {"general.alignment = " + std::to_string(a), "power of two"});
  }
  GgufWriter w;
  w.AddString("general.alignment", "32");
  ExpectError(w.Serialize(), absl::StatusCode::kDataLoss, {"general.alignment has type string"});
}

TEST(GgufReaderTest, OpenRejectsMissingPathsAndDirectories) {
  const std::string missing = TempPath("does_not_exist.gguf");
  auto f = GgufFile::Open(missing);
  EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(f), HasSubstr(missing));

  auto d = GgufFile::Open(::testing::TempDir());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Message(d), HasSubstr("directory"));
}

TEST(GgufReaderTest, OpenErrorsNameThePath) {
  std::string bytes = SmallFile();
  Store<uint32_t>(bytes, 4, 1);
  const std::string path = TempPath("v1.gguf");
  WriteBytes(path, bytes);
  auto f = GgufFile::Open(path);
  EXPECT_EQ(f.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(Message(f), HasSubstr(path + ": GGUF version 1"));
  std::remove(path.c_str());
}

// Random byte-level mutations of a valid file must never crash the reader;
// whatever it accepts must be self-consistent. Fixed seed: reproducible.
// SmallFile plus every value type, string arrays and a third tensor, so that
// mutations reach every branch of the value parser.
std::string RichFile() {
  GgufWriter w;
  using T = GgufValueType;
  w.AddString("general.architecture", "llama");
  w.AddStringArray("tokens", {"a", "bc", "", "def"});
  w.AddFloat32Array("scores", {0.5f, -1.0f});
  w.AddInt32Array("types", {1, 3, 1});
  w.AddBool("flag", true);
  w.AddUint64("big", 1);
  EXPECT_TRUE(w.AddValue("i8", {T::kInt8, T::kUint8, int64_t{-3}}).ok());
  EXPECT_TRUE(w.AddValue("u16s", {T::kArray, T::kUint16, std::vector<uint64_t>{1, 2}}).ok());
  EXPECT_TRUE(w.AddValue("f64", {T::kFloat64, T::kUint8, 2.5}).ok());
  EXPECT_TRUE(w.AddValue("bools", {T::kArray, T::kBool, std::vector<bool>{true, false}}).ok());
  EXPECT_TRUE(w.AddTensorF32("a", {2, 3}, {1, 2, 3, 4, 5, 6}).ok());
  EXPECT_TRUE(w.AddTensor("b", GgmlType::kQ4_1, {32, 2}, std::string(40, '\x11')).ok());
  EXPECT_TRUE(w.AddTensor("c", GgmlType::kF16, {4}, std::string(8, '\x3c')).ok());
  return w.Serialize();
}

TEST(GgufReaderTest, RandomMutationsNeverCrash) {
  for (const std::string& good : {SmallFile(), RichFile()}) {
    SNAPFILL_ASSERT_OK(GgufFile::FromBytes(good));
    std::mt19937 rng(20240601);
    int accepted = 0;
    for (int iter = 0; iter < 2000; ++iter) {
      std::string bytes = good;
      const int kind = static_cast<int>(rng() % 4);
      const int edits = 1 + static_cast<int>(rng() % 4);
      for (int e = 0; e < edits; ++e) {
        const size_t pos = rng() % bytes.size();
        switch (kind) {
          case 0:  // flip one bit
            bytes[pos] = static_cast<char>(bytes[pos] ^ (1 << (rng() % 8)));
            break;
          case 1:  // random byte
            bytes[pos] = static_cast<char>(rng());
            break;
          case 2:  // extreme byte, which makes huge or negative little-endian fields
            bytes[pos] = (rng() & 1) ? '\xff' : '\x00';
            break;
          default:  // truncate
            bytes.resize(pos);
            break;
        }
        if (bytes.empty()) break;
      }
      auto f = GgufFile::FromBytes(bytes);
      if (!f.ok()) {
        EXPECT_FALSE(f.status().message().empty());
        continue;
      }
      ++accepted;
      const GgufFile& g = **f;
      for (const GgufTensorInfo& t : g.tensors()) {
        const GgmlTypeTraits tr = GetTypeTraits(t.type);
        ASSERT_NE(tr.name, nullptr);
        ASSERT_GE(t.shape.size(), 1u);
        ASSERT_LE(t.shape.size(), 4u);
        ASSERT_GT(t.num_elements(), 0);
        ASSERT_EQ(t.offset % g.alignment(), 0u);
        ASSERT_LE(t.offset + t.size_bytes, g.file_size());
      }
    }
    // Mutations in tensor data or padding are harmless, so some must pass.
    EXPECT_GT(accepted, 0);
    EXPECT_LT(accepted, 2000);
  }
}

}  // namespace
}  // namespace snapfill
