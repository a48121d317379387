#include "src/kv/cache_file.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "snapfill/status.h"
#include "src/gguf/fingerprint.h"
#include "src/gguf/gguf_reader.h"
#include "tools/testmodel/gguf_writer.h"
#include "tests/testing/files.h"
#include "tests/testing/status_matchers.h"

namespace snapfill {
namespace {

using ::testing::HasSubstr;
using ::snapfill::testing::ListDir;
using ::snapfill::testing::ReadAll;
using ::snapfill::testing::WriteRaw;

constexpr char kFingerprintA[] = "xxh3:00112233445566aa";
constexpr char kFingerprintB[] = "xxh3:ffeeddccbbaa9988";




// A cache with random K/V bits (special values included), random
// non-negative positions and the given per-layer sizes.
std::unique_ptr<KvCache> RandomKv(int64_t num_kv_heads, int64_t head_dim, int64_t capacity,
                                  const std::vector<int64_t>& sizes, uint32_t seed) {
  KvCacheShape shape;
  shape.num_layers = static_cast<int64_t>(sizes.size());
  shape.num_kv_heads = num_kv_heads;
  shape.head_dim = head_dim;
  shape.capacity = capacity;
  auto kv = KvCache::Create(shape);
  SNAPFILL_CHECK(kv.ok()) << kv.status();
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int32_t> position(0, 1 << 20);
  const float specials[] = {-0.0f, std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::denorm_min()};
  for (size_t l = 0; l < sizes.size(); ++l) {
    for (int64_t h = 0; h < num_kv_heads; ++h) {
      // Fill the whole capacity so that a loader reading past size(l) or
      // a saver writing it would be caught by the byte comparisons.
      for (int64_t i = 0; i < capacity * head_dim; ++i) {
        (*kv)->k(l, h)[i] = normal(rng);
        (*kv)->v(l, h)[i] = normal(rng);
      }
      for (int64_t i = 0; i < capacity; ++i) (*kv)->pos(l, h)[i] = position(rng);
    }
    (*kv)->set_size(l, sizes[l]);
  }
  (*kv)->k(0, 0)[0] = specials[0];
  (*kv)->k(0, 0)[1] = specials[1];
  (*kv)->v(0, 0)[0] = specials[2];
  (*kv)->v(0, 0)[1] = specials[3];
  return std::move(kv).value();
}

PromptCache MakeCache(std::vector<int64_t> sizes, int64_t num_kv_heads = 3,
                      int64_t head_dim = 5, int64_t capacity = 9, uint32_t seed = 1) {
  PromptCache cache;
  cache.model_fingerprint = kFingerprintA;
  static constexpr char kConfig[] = "{\"schedule\":\"im\",\"budget\":7}\0tail";
  cache.config = std::string(kConfig, sizeof(kConfig) - 1);  // keeps the NUL
  cache.next_position = 123456789012;
  cache.input_tokens = 4242;
  cache.kernels = "x86-64 avx512 (of avx512): products avx512-vnni";
  cache.kv = RandomKv(num_kv_heads, head_dim, capacity, sizes, seed);
  return cache;
}

// Checks that every valid entry of `b` equals `a` bit for bit.
void ExpectSameEntries(const KvCache& a, const KvCache& b) {
  ASSERT_EQ(a.shape().num_layers, b.shape().num_layers);
  ASSERT_EQ(a.shape().num_kv_heads, b.shape().num_kv_heads);
  ASSERT_EQ(a.shape().head_dim, b.shape().head_dim);
  const int64_t d = a.shape().head_dim;
  for (int64_t l = 0; l < a.shape().num_layers; ++l) {
    ASSERT_EQ(a.size(l), b.size(l)) << "layer " << l;
    for (int64_t h = 0; h < a.shape().num_kv_heads; ++h) {
      const size_t n = a.size(l);
      EXPECT_EQ(std::memcmp(a.k(l, h), b.k(l, h), n * d * sizeof(float)), 0)
          << "K layer " << l << " head " << h;
      EXPECT_EQ(std::memcmp(a.v(l, h), b.v(l, h), n * d * sizeof(float)), 0)
          << "V layer " << l << " head " << h;
      EXPECT_EQ(std::memcmp(a.pos(l, h), b.pos(l, h), n * sizeof(int32_t)), 0)
          << "positions layer " << l << " head " << h;
    }
  }
}

// Builds a cache file from the layout documented in cache_file.h, field by
// field, independently of SaveCacheFile.
class SpecBuilder {
 public:
  SpecBuilder& Raw(std::string_view s) {
    bytes_.append(s);
    return *this;
  }
  template <typename T>
  SpecBuilder& Put(T v) {
    bytes_.append(reinterpret_cast<const char*>(&v), sizeof(v));
    return *this;
  }
  SpecBuilder& Str(std::string_view s) {
    Put<uint64_t>(s.size());
    return Raw(s);
  }
  SpecBuilder& Header(std::string_view fingerprint, std::string_view config, int64_t next_pos,
                      int64_t input_tokens, uint64_t layers, uint64_t heads, uint64_t head_dim,
                      uint32_t version = 2, std::string_view kernels = "", uint32_t entry_fields = 0) {
    Raw(std::string_view("SNAPFILL-KV\0", 12));
    Put<uint32_t>(version);
    Str(fingerprint);
    Str(config);
    Str(kernels);
    Put<int64_t>(next_pos);
    Put<int64_t>(input_tokens);
    Put<uint64_t>(layers);
    Put<uint64_t>(heads);
    Put<uint64_t>(head_dim);
    return Put<uint32_t>(entry_fields);
  }
  // One layer's valid entries and capacity.
  SpecBuilder& Layer(uint64_t size, uint64_t capacity) { return Put<uint64_t>(size).Put<uint64_t>(capacity); }
  // Appends the XXH3-64 of everything so far.
  std::string Finish() const {
    std::string out = bytes_;
    const uint64_t h = XXH3_64bits(out.data(), out.size());
    out.append(reinterpret_cast<const char*>(&h), sizeof(h));
    return out;
  }
  const std::string& bytes() const { return bytes_; }

 private:
  std::string bytes_;
};

// Copies `bytes` into a heap block of exactly that size, so that a parser
// reading one byte too far is caught by AddressSanitizer.
absl::StatusOr<PromptCache> ParseExact(std::string_view bytes, std::string_view expected = "",
                                       int64_t extra = 0) {
  std::unique_ptr<char[]> copy(new char[bytes.size()]);
  std::memcpy(copy.get(), bytes.data(), bytes.size());
  return ParseCacheFile(std::string_view(copy.get(), bytes.size()), "test.kv", expected, extra);
}

class CacheFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/cache_file_test.XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr) << std::strerror(errno);
    dir_ = tmpl;
  }
  void TearDown() override { std::system(("rm -rf '" + dir_ + "'").c_str()); }
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

  // Saves a small cache and returns its bytes.
  std::string SmallFileBytes() {
    const std::string path = Path("small.kv");
    PromptCache cache = MakeCache({2, 1}, /*num_kv_heads=*/2, /*head_dim=*/3, /*capacity=*/4);
    SNAPFILL_CHECK(SaveCacheFile(path, cache, true).ok());
    return ReadAll(path);
  }

  std::string dir_;
};

TEST_F(CacheFileTest, RoundTripKeepsEverything) {
  const std::vector<int64_t> sizes = {5, 0, 9, 1};
  PromptCache cache = MakeCache(sizes);
  const std::string path = Path("cache.kv");
  SNAPFILL_ASSERT_OK(SaveCacheFile(path, cache, false));
  EXPECT_EQ(ListDir(dir_), std::vector<std::string>{"cache.kv"});

  auto loaded = LoadCacheFile(path, kFingerprintA, /*extra_capacity=*/4);
  SNAPFILL_ASSERT_OK(loaded);
  EXPECT_EQ(loaded->model_fingerprint, cache.model_fingerprint);
  EXPECT_EQ(loaded->config, cache.config);
  EXPECT_EQ(loaded->next_position, cache.next_position);
  EXPECT_EQ(loaded->input_tokens, cache.input_tokens);
  ASSERT_NE(loaded->kv, nullptr);
  EXPECT_EQ(loaded->kernels, cache.kernels);
  EXPECT_EQ(loaded->capacities, std::vector<int64_t>(sizes.size(), 9)) << "the saved cache's capacity";
  EXPECT_EQ(loaded->kv->capacity(), 9 + 4) << "largest layer plus extra_capacity";
  ExpectSameEntries(*cache.kv, *loaded->kv);

  // The loaded cache has room to append: extra_capacity entries to the
  // largest layer.
  std::vector<float> rows(4 * 3 * 5, 1.0f);  // 4 tokens x [3 heads, 5]
  SNAPFILL_EXPECT_OK(loaded->kv->Append(2, rows.data(), rows.data(), 4, 15, nullptr));
  EXPECT_FALSE(loaded->kv->Append(2, rows.data(), rows.data(), 1, 15, nullptr).ok());
}

TEST_F(CacheFileTest, FileHoldsOnlyValidEntries) {
  // Size from the documented layout: header, then per layer and head
  // size(l) * (2 * head_dim * 4 + 4) bytes, then the 8-byte checksum.
  const std::vector<int64_t> sizes = {5, 0, 9, 1};
  PromptCache cache = MakeCache(sizes, /*num_kv_heads=*/3, /*head_dim=*/5, /*capacity=*/50);
  const std::string path = Path("cache.kv");
  SNAPFILL_ASSERT_OK(SaveCacheFile(path, cache, false));
  uint64_t expected = 12 + 4 + 8 + cache.model_fingerprint.size() + 8 + cache.config.size() + 8 +
                      cache.kernels.size() + 8 + 8 + 3 * 8 + 4 + sizes.size() * 2 * 8 + 8;
  for (int64_t n : sizes) expected += 3 * n * (2 * 5 * 4 + 4);
  EXPECT_EQ(ReadAll(path).size(), expected);
}

TEST_F(CacheFileTest, MatchesDocumentedLayout) {
  // One layer, one head, head_dim 2, two entries, built by hand.
  SpecBuilder spec;
  spec.Header("xxh3:abc", "{}", 17, 20, 1, 1, 2, /*version=*/2, "x86-64 avx2");
  spec.Layer(2, 7);
  for (float f : {1.0f, 2.0f, 3.0f, 4.0f}) spec.Put<float>(f);   // K
  for (float f : {-1.0f, -2.0f, -3.0f, -4.0f}) spec.Put<float>(f);  // V
  spec.Put<int32_t>(5).Put<int32_t>(19);
  const std::string bytes = spec.Finish();

  auto parsed = ParseExact(bytes, "xxh3:abc", 0);
  SNAPFILL_ASSERT_OK(parsed);
  EXPECT_EQ(parsed->next_position, 17);
  EXPECT_EQ(parsed->input_tokens, 20);
  EXPECT_EQ(parsed->config, "{}");
  EXPECT_EQ(parsed->kernels, "x86-64 avx2");
  EXPECT_EQ(parsed->capacities, std::vector<int64_t>{7});
  ASSERT_EQ(parsed->kv->size(0), 2);
  EXPECT_EQ(parsed->kv->capacity(), 2);
  EXPECT_EQ(parsed->kv->k(0, 0)[3], 4.0f);
  EXPECT_EQ(parsed->kv->v(0, 0)[2], -3.0f);
  EXPECT_EQ(parsed->kv->pos(0, 0)[1], 19);

  // SaveCacheFile writes exactly these bytes.
  const std::string path = Path("spec.kv");
  SNAPFILL_ASSERT_OK(SaveCacheFile(path, *std::move(parsed), false));
  EXPECT_TRUE(ReadAll(path) == bytes);
}

TEST_F(CacheFileTest, EmptyCacheRoundTrips) {
  PromptCache cache = MakeCache({0, 0});
  cache.config.clear();
  cache.model_fingerprint.clear();
  const std::string path = Path("empty.kv");
  SNAPFILL_ASSERT_OK(SaveCacheFile(path, cache, false));
  for (int64_t extra : {0, 8}) {
    auto loaded = LoadCacheFile(path, "", extra);
    SNAPFILL_ASSERT_OK(loaded);
    EXPECT_EQ(loaded->kv->size(0), 0);
    EXPECT_EQ(loaded->kv->size(1), 0);
    EXPECT_EQ(loaded->kv->capacity(), std::max<int64_t>(1, extra));
    EXPECT_EQ(loaded->model_fingerprint, "");
  }
}

TEST_F(CacheFileTest, EveryTruncationIsRefused) {
  const std::string bytes = SmallFileBytes();
  SNAPFILL_ASSERT_OK(ParseExact(bytes));
  for (size_t n = 0; n < bytes.size(); ++n) {
    auto parsed = ParseExact(std::string_view(bytes).substr(0, n));
    ASSERT_FALSE(parsed.ok()) << "prefix of " << n << " bytes accepted";
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kDataLoss)
        << "prefix " << n << ": " << parsed.status();
  }
  // The same through a file, with its path in the message.
  const std::string path = Path("truncated.kv");
  WriteRaw(path, bytes.substr(0, bytes.size() - 9));
  auto loaded = LoadCacheFile(path, "", 0);
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kDataLoss) << loaded.status();
  EXPECT_THAT(std::string(loaded.status().message()), HasSubstr(path + " is truncated"));
}

TEST_F(CacheFileTest, TrailingBytesAreRefused) {
  const std::string bytes = SmallFileBytes() + "x";
  auto parsed = ParseExact(bytes);
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(parsed.status().message()), HasSubstr("after the end"));
}

TEST_F(CacheFileTest, EveryFlippedByteIsRefused) {
  const std::string bytes = SmallFileBytes();
  const PromptCache small = MakeCache({2, 1});
  const size_t entry_fields_at = 12 + 4 + 8 + small.model_fingerprint.size() + 8 + small.config.size() + 8 +
                                 small.kernels.size() + 8 + 8 + 3 * 8;
  for (size_t i = 0; i < bytes.size(); ++i) {
    for (uint8_t mask : {0x01, 0x80}) {
      std::string damaged = bytes;
      damaged[i] = static_cast<char>(damaged[i] ^ mask);
      auto parsed = ParseExact(damaged);
      ASSERT_FALSE(parsed.ok()) << "flip of byte " << i << " accepted";
      const bool version_byte = i >= 12 && i < 16;
      // (The entry fields: bits a newer snapfill may set.)
      const bool fields_byte = i >= entry_fields_at && i < entry_fields_at + 4;
      if (version_byte || fields_byte) {
        EXPECT_TRUE(parsed.status().code() == absl::StatusCode::kUnimplemented ||
                    parsed.status().code() == absl::StatusCode::kDataLoss)
            << parsed.status();
      } else {
        EXPECT_EQ(parsed.status().code(), absl::StatusCode::kDataLoss)
            << "byte " << i << ": " << parsed.status();
      }
    }
  }
}

TEST_F(CacheFileTest, FlippedBytesWithForgedChecksumAreHandled) {
  // A fuzzer can forge the checksum, so the other checks must stand alone:
  // every flip is either refused or yields a cache that matches the file.
  const std::string bytes = SmallFileBytes();
  const std::string body = bytes.substr(0, bytes.size() - 8);
  int accepted = 0;
  for (size_t i = 0; i < body.size(); ++i) {
    for (uint8_t mask : {0x01, 0x40, 0x80}) {
      std::string damaged = body;
      damaged[i] = static_cast<char>(damaged[i] ^ mask);
      SpecBuilder b;
      b.Raw(damaged);
      auto parsed = ParseExact(b.Finish());
      if (!parsed.ok()) continue;
      ++accepted;
      // Only bytes that carry data without constraints (strings, counts
      // of tokens, K/V bits, position bits that keep it >= 0) may change.
      ASSERT_NE(parsed->kv, nullptr);
      EXPECT_EQ(parsed->kv->size(0), 2) << "byte " << i;
      EXPECT_EQ(parsed->kv->size(1), 1) << "byte " << i;
    }
  }
  EXPECT_GT(accepted, 0);
}

TEST_F(CacheFileTest, DamagedPayloadReportsChecksum) {
  std::string bytes = SmallFileBytes();
  bytes[bytes.size() - 20] ^= 0x10;  // inside the last head's data
  const std::string path = Path("damaged.kv");
  WriteRaw(path, bytes);
  auto loaded = LoadCacheFile(path, "", 0);
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(loaded.status().message()),
              HasSubstr("cache file " + path + " is damaged: checksum mismatch"));
}

TEST_F(CacheFileTest, WrongMagicIsRefused) {
  std::string bytes = SmallFileBytes();
  bytes[0] = 'G';
  auto parsed = ParseExact(bytes);
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(parsed.status().message()), HasSubstr("not a snapfill cache file"));
  // A GGUF model passed as a cache.
  auto gguf = ParseExact(std::string("GGUF\3\0\0\0", 8) + std::string(100, '\0'));
  EXPECT_THAT(std::string(gguf.status().message()), HasSubstr("not a snapfill cache file"));
}

TEST_F(CacheFileTest, FutureVersionIsRefused) {
  std::string bytes = SmallFileBytes();
  const uint32_t version = 7;
  std::memcpy(&bytes[12], &version, 4);
  auto parsed = ParseExact(bytes);
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(parsed.status().message()),
              HasSubstr("version 7 is newer than this snapfill (2)"));
}

TEST_F(CacheFileTest, OtherModelIsRefused) {
  const std::string path = Path("a.kv");
  PromptCache cache = MakeCache({3, 2});
  SNAPFILL_ASSERT_OK(SaveCacheFile(path, cache, false));
  auto loaded = LoadCacheFile(path, kFingerprintB, 0);
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(loaded.status().message()), HasSubstr(kFingerprintA));
  EXPECT_THAT(std::string(loaded.status().message()), HasSubstr(kFingerprintB));
  EXPECT_THAT(std::string(loaded.status().message()), HasSubstr(path));
  SNAPFILL_EXPECT_OK(LoadCacheFile(path, kFingerprintA, 0));
  SNAPFILL_EXPECT_OK(LoadCacheFile(path, "", 0));  // no model to compare with
}

TEST_F(CacheFileTest, MissingFileIsNotFound) {
  auto loaded = LoadCacheFile(Path("missing.kv"), "", 0);
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(loaded.status().message()), HasSubstr(Path("missing.kv")));
  auto dir = LoadCacheFile(dir_, "", 0);
  EXPECT_EQ(dir.status().code(), absl::StatusCode::kFailedPrecondition);
  WriteRaw(Path("empty.kv"), "");
  auto empty = LoadCacheFile(Path("empty.kv"), "", 0);
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kDataLoss);
}

TEST_F(CacheFileTest, ExistingFileNeedsOverwrite) {
  const std::string path = Path("cache.kv");
  WriteRaw(path, "precious");
  PromptCache cache = MakeCache({3, 2});
  const absl::Status s = SaveCacheFile(path, cache, false);
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(s.message()), HasSubstr("use --force to overwrite"));
  EXPECT_EQ(ReadAll(path), "precious");
  EXPECT_EQ(ListDir(dir_), std::vector<std::string>{"cache.kv"});

  SNAPFILL_ASSERT_OK(SaveCacheFile(path, cache, true));
  auto loaded = LoadCacheFile(path, kFingerprintA, 0);
  SNAPFILL_ASSERT_OK(loaded);
  ExpectSameEntries(*cache.kv, *loaded->kv);
  EXPECT_EQ(ListDir(dir_), std::vector<std::string>{"cache.kv"});
}

TEST_F(CacheFileTest, BadTargetsAreRefusedCleanly) {
  PromptCache cache = MakeCache({3, 2});
  ASSERT_EQ(::mkdir(Path("sub").c_str(), 0755), 0);
  const absl::Status dir = SaveCacheFile(Path("sub"), cache, true);
  EXPECT_EQ(dir.code(), absl::StatusCode::kFailedPrecondition) << dir;
  WriteRaw(Path("plain"), "x");
  const absl::Status through_file = SaveCacheFile(Path("plain") + "/c.kv", cache, true);
  EXPECT_FALSE(through_file.ok());
  EXPECT_THAT(std::string(through_file.message()), HasSubstr(Path("plain") + "/c.kv"));
  const absl::Status missing_dir = SaveCacheFile(Path("nope/c.kv"), cache, false);
  EXPECT_EQ(missing_dir.code(), absl::StatusCode::kNotFound) << missing_dir;
  EXPECT_EQ(ListDir(dir_), (std::vector<std::string>{"plain", "sub"}));
  EXPECT_TRUE(ListDir(Path("sub")).empty());
}

TEST_F(CacheFileTest, SaveRefusesUnrepresentableCaches) {
  PromptCache no_kv;
  EXPECT_EQ(SaveCacheFile(Path("a.kv"), no_kv, false).code(),
            absl::StatusCode::kInvalidArgument);
  PromptCache negative = MakeCache({2});
  negative.next_position = -1;
  EXPECT_EQ(SaveCacheFile(Path("a.kv"), negative, false).code(),
            absl::StatusCode::kInvalidArgument);
  PromptCache bad_pos = MakeCache({2});
  bad_pos.kv->pos(0, 1)[1] = -5;
  const absl::Status s = SaveCacheFile(Path("a.kv"), bad_pos, false);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("position -5"));
  EXPECT_TRUE(ListDir(dir_).empty());
}

TEST_F(CacheFileTest, NegativeExtraCapacityIsRefused) {
  EXPECT_EQ(ParseExact(SmallFileBytes(), "", -1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Crafted files with a valid checksum: the checks must not rely on it.
TEST(CacheFileCraftedTest, AbsurdCountsAreRefusedWithoutAllocating) {
  struct Case {
    const char* what;
    std::string bytes;
  };
  std::vector<Case> cases;
  {
    SpecBuilder b;
    b.Header("f", "", 0, 0, 0, 1, 1);
    cases.push_back({"zero layers", b.Finish()});
  }
  {
    SpecBuilder b;
    b.Header("f", "", 0, 0, uint64_t{1} << 62, 1, 1);
    cases.push_back({"2^62 layers", b.Finish()});
  }
  {
    SpecBuilder b;
    b.Header("f", "", 0, 0, 4096, 1, 1);  // within limits, but no sizes follow
    cases.push_back({"4096 layers, no sizes", b.Finish()});
  }
  {
    SpecBuilder b;
    b.Header("f", "", 0, 0, 1, 4096, 65536).Layer(uint64_t{1} << 60, uint64_t{1} << 60);
    cases.push_back({"2^60 entries", b.Finish()});
  }
  {
    SpecBuilder b;
    b.Header("f", "", 0, 0, 1, 1, 1).Layer(UINT64_MAX, UINT64_MAX);
    cases.push_back({"UINT64_MAX entries", b.Finish()});
  }
  {
    SpecBuilder b;
    b.Raw(std::string_view("SNAPFILL-KV\0", 12)).Put<uint32_t>(2).Put<uint64_t>(UINT64_MAX);
    cases.push_back({"fingerprint length", b.Finish()});
  }
  {
    SpecBuilder b;
    b.Raw(std::string_view("SNAPFILL-KV\0", 12)).Put<uint32_t>(2).Str("f").Put<uint64_t>(
        uint64_t{1} << 40);
    cases.push_back({"config length", b.Finish()});
  }
  {
    // 4000 empty layers and one layer of 20000 entries: loading would pad
    // every layer to 20000 entries, ~4000 times what the file stores.
    SpecBuilder b;
    b.Header("f", "", 0, 0, 4000, 1, 1);
    b.Layer(20000, 20000);
    for (int i = 1; i < 4000; ++i) b.Layer(0, 0);
    for (int i = 0; i < 20000; ++i) b.Put<float>(0).Put<float>(0).Put<int32_t>(i);
    cases.push_back({"padding", b.Finish()});
  }
  {
    SpecBuilder b;
    b.Header("f", "", -3, 0, 1, 1, 1).Layer(0, 0);
    cases.push_back({"negative next_position", b.Finish()});
  }
  {
    SpecBuilder b;
    b.Header("f", "", 0, 0, 1, 1, 1).Layer(1, 1);
    b.Put<float>(1).Put<float>(2).Put<int32_t>(-7);
    cases.push_back({"negative position", b.Finish()});
  }
  {
    SpecBuilder b;
    b.Header("f", "", 0, 0, 1, 1, 1, /*version=*/0).Layer(0, 0);
    cases.push_back({"version 0", b.Finish()});
  }
  {
    SpecBuilder b;
    b.Header("f", "", 0, 0, 1, 1, 1).Layer(1, 0);
    b.Put<float>(1).Put<float>(2).Put<int32_t>(3);
    cases.push_back({"capacity below size", b.Finish()});
  }
  for (const Case& c : cases) {
    auto parsed = ParseExact(c.bytes);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kDataLoss)
        << c.what << ": " << parsed.status();
  }
}

TEST(CacheFileCraftedTest, NegativePositionIsNamed) {
  SpecBuilder b;
  b.Header("f", "", 0, 0, 1, 1, 1).Layer(1, 1);
  b.Put<float>(1).Put<float>(2).Put<int32_t>(-7);
  auto parsed = ParseExact(b.Finish());
  EXPECT_THAT(std::string(parsed.status().message()), HasSubstr("position -7"));
}

// Version 2's room to grow: per-entry scores are read past (no cache keeps
// them yet), fields this snapfill does not know are refused as a newer
// snapfill's, and version 1 files as an earlier one's, saying what to do.
TEST(CacheFileCraftedTest, EntryFieldsAndOlderVersions) {
  SpecBuilder scored;
  scored.Header("f", "", 0, 3, 1, 1, 1, /*version=*/2, "", kEntryScores).Layer(2, 4);
  scored.Put<float>(1).Put<float>(2).Put<float>(10).Put<float>(20).Put<int32_t>(0).Put<int32_t>(2);
  scored.Put<float>(0.25f).Put<float>(0.75f);  // the scores
  auto parsed = ParseExact(scored.Finish());
  SNAPFILL_ASSERT_OK(parsed);
  ASSERT_EQ(parsed->kv->size(0), 2);
  EXPECT_EQ(parsed->kv->v(0, 0)[1], 20.0f);
  EXPECT_EQ(parsed->kv->pos(0, 0)[1], 2);

  SpecBuilder unknown;
  unknown.Header("f", "", 0, 0, 1, 1, 1, /*version=*/2, "", /*entry_fields=*/2).Layer(0, 0);
  parsed = ParseExact(unknown.Finish());
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kUnimplemented) << parsed.status();
  EXPECT_THAT(std::string(parsed.status().message()), HasSubstr("entry fields 0x2"));

  SpecBuilder v1;
  v1.Raw(std::string_view("SNAPFILL-KV\0", 12)).Put<uint32_t>(1).Str("f").Str("");
  parsed = ParseExact(v1.Finish());
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kFailedPrecondition) << parsed.status();
  EXPECT_THAT(std::string(parsed.status().message()),
              HasSubstr("format version 1, from an earlier snapfill; this one reads version 2 only: make it "
                        "again with snapfill prefill --out"));
}

// ModelFingerprint hashes every byte of the model file.
std::string TinyGguf(float weight) {
  GgufWriter w;
  w.AddString("general.architecture", "llama");
  SNAPFILL_CHECK(w.AddTensorF32("w", {4}, {1.0f, 2.0f, 3.0f, weight}).ok());
  return w.Serialize();
}

TEST(ModelFingerprintTest, HashesTheWholeFile) {
  const std::string bytes = TinyGguf(4.0f);
  auto a = GgufFile::FromBytes(bytes);
  auto b = GgufFile::FromBytes(bytes);
  SNAPFILL_ASSERT_OK(a);
  SNAPFILL_ASSERT_OK(b);
  const std::string fa = ModelFingerprint(**a);
  EXPECT_EQ(fa, ModelFingerprint(**b));
  ASSERT_EQ(fa.size(), 5u + 16u);
  EXPECT_EQ(fa.substr(0, 5), "xxh3:");
  EXPECT_EQ(fa.find_first_not_of("0123456789abcdef", 5), std::string::npos) << fa;
  char expected[17];
  std::snprintf(expected, sizeof(expected), "%016llx",
                static_cast<unsigned long long>(XXH3_64bits(bytes.data(), bytes.size())));
  EXPECT_EQ(fa.substr(5), expected);

  // One byte of tensor data changed: same metadata, different fingerprint.
  const std::string other = TinyGguf(5.0f);
  ASSERT_EQ(other.size(), bytes.size());
  size_t differing = 0;
  for (size_t i = 0; i < bytes.size(); ++i) differing += bytes[i] != other[i];
  ASSERT_LE(differing, 4u);
  auto c = GgufFile::FromBytes(other);
  SNAPFILL_ASSERT_OK(c);
  EXPECT_NE(ModelFingerprint(**c), fa);
  // Every single-byte change to the file changes the fingerprint.
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string flipped = bytes;
    flipped[i] ^= 1;
    EXPECT_NE(FingerprintBytes(flipped), fa) << "byte " << i;
  }
}

}  // namespace
}  // namespace snapfill
