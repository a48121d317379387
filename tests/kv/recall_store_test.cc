#include "src/kv/recall_store.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "snapfill/backend.h"
#include "src/base/half.h"
#include "src/base/int8_rows.h"
#include "tests/testing/files.h"
#include "tests/testing/status_matchers.h"

namespace snapfill {
namespace {

using ::testing::HasSubstr;

class RecallStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/recall_store_test.XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr) << std::strerror(errno);
    root_ = tmpl;
  }
  void TearDown() override { std::system(("rm -rf '" + root_ + "'").c_str()); }

  RecallStoreInfo Info(RecallFormat format = RecallFormat::kF16) const {
    RecallStoreInfo info;
    info.num_layers = 3;
    info.num_kv_heads = 2;
    info.head_dim = 8;
    info.format = format;
    info.model_fingerprint = "0123456789abcdef";
    info.input_digest = 42;
    info.input_tokens = 1000;
    info.plan_digest = 7;
    return info;
  }

  // Candidate buffers of `rows` rows per head (head_stride rows apart),
  // random values, positions 100 * head + row.
  struct Candidates {
    int64_t rows, d;
    std::vector<float> k, v;
    std::vector<int32_t> pos;
  };
  static Candidates MakeCandidates(int64_t heads, int64_t rows, int64_t d, uint32_t seed) {
    Candidates c{rows, d, {}, {}, {}};
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 3.0f);
    c.k.resize(heads * rows * d);
    c.v.resize(heads * rows * d);
    for (float& x : c.k) x = dist(rng);
    for (float& x : c.v) x = dist(rng);
    c.pos.resize(heads * rows);
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t r = 0; r < rows; ++r) c.pos[h * rows + r] = static_cast<int32_t>(100 * h + r);
    return c;
  }

  std::string root_;
};

// f16: every entry comes back as the f32 of its f16 (exact when the value
// is one); q8 within max|x| / 254 of the entry's largest magnitude.
TEST_F(RecallStoreTest, RoundTripsEntries) {
  for (RecallFormat format : {RecallFormat::kF16, RecallFormat::kQ8}) {
    SCOPED_TRACE(RecallFormatName(format));
    const RecallStoreInfo info = Info(format);
    const std::string dir = root_ + "/" + RecallFormatName(format);
    auto store = RecallStore::Create(dir, info);
    SNAPFILL_ASSERT_OK(store);
    // Block conversions as the engine sets them (here counted, to see them used).
    int64_t converted = 0;
    RecallStore::Conversions counted;
    counted.to_half = [&](const float* x, uint16_t* y, int64_t n) {
      converted += n;
      for (int64_t i = 0; i < n; ++i) y[i] = Fp32ToFp16(x[i]);
    };
    counted.from_half = [&](const uint16_t* x, float* y, int64_t n) {
      converted += n;
      for (int64_t i = 0; i < n; ++i) y[i] = Fp16ToFp32(x[i]);
    };
    counted.to_int8 = [&](const float* x, uint8_t* y, int64_t rows, int64_t dim) {
      converted += rows * dim;
      EncodeInt8Rows(x, rows, dim, y);
    };
    counted.from_int8 = [&](const uint8_t* y, float* x, int64_t rows, int64_t dim) {
      converted += rows * dim;
      DecodeInt8Rows(y, rows, dim, x);
    };
    (*store)->SetConversions(std::move(counted));
    const int64_t d = info.head_dim, heads = info.num_kv_heads;
    Candidates c = MakeCandidates(heads, 10, d, 3);
    // Head 0 evicts rows 1, 4, 7; head 1 rows 0, 2, 9 (then 5, 6).
    const std::vector<int32_t> e0 = {1, 4, 7, 3, 8}, e1 = {0, 2, 9, 5, 6};
    const int32_t* idx[2] = {e0.data(), e1.data()};
    SNAPFILL_ASSERT_OK((*store)->Append(1, 3, idx, c.k.data(), c.v.data(), c.rows * d, c.pos.data(), c.rows));
    const int32_t* idx2[2] = {e0.data() + 3, e1.data() + 3};
    SNAPFILL_ASSERT_OK((*store)->Append(1, 2, idx2, c.k.data(), c.v.data(), c.rows * d, c.pos.data(), c.rows));
    EXPECT_EQ((*store)->slots(1), 5);
    EXPECT_EQ((*store)->slots(0), 0);
    EXPECT_EQ((*store)->bytes(), 5 * RecallStore::SlotBytes(info));
    EXPECT_EQ(converted, 2 * 5 * heads * d);

    std::vector<float> k(heads * 5 * d);
    std::vector<int32_t> pos(heads * 5);
    SNAPFILL_ASSERT_OK((*store)->ReadKeys(1, 0, 5, k.data(), pos.data()));
    std::vector<int32_t> pos_only(heads * 2);
    SNAPFILL_ASSERT_OK((*store)->ReadPositions(1, 3, 2, pos_only.data()));
    for (int64_t h = 0; h < heads; ++h) {
      EXPECT_EQ(pos_only[h], pos[3 * heads + h]);
      EXPECT_EQ(pos_only[heads + h], pos[4 * heads + h]);
    }
    for (int64_t h = 0; h < heads; ++h) {
      const std::vector<int32_t>& e = h == 0 ? e0 : e1;
      for (int64_t i = 0; i < 5; ++i) {
        EXPECT_EQ(pos[i * heads + h], c.pos[h * c.rows + e[i]]);
        std::vector<float> kk(d), vv(d);
        int32_t p = -1;
        SNAPFILL_ASSERT_OK((*store)->ReadEntry(1, h, i, kk.data(), vv.data(), &p));
        EXPECT_EQ(p, c.pos[h * c.rows + e[i]]);
        const float* k0 = c.k.data() + (h * c.rows + e[i]) * d;
        const float* v0 = c.v.data() + (h * c.rows + e[i]) * d;
        float kmax = 0, vmax = 0;
        for (int64_t t = 0; t < d; ++t) kmax = std::max(kmax, std::abs(k0[t]));
        for (int64_t t = 0; t < d; ++t) vmax = std::max(vmax, std::abs(v0[t]));
        for (int64_t t = 0; t < d; ++t) {
          EXPECT_EQ(k[(i * heads + h) * d + t], kk[t]);  // the block read and the entry read agree
          if (format == RecallFormat::kF16) {
            EXPECT_EQ(kk[t], Fp16ToFp32(Fp32ToFp16(k0[t])));
            EXPECT_EQ(vv[t], Fp16ToFp32(Fp32ToFp16(v0[t])));
          } else {
            EXPECT_LE(std::abs(kk[t] - k0[t]), kmax / 254 * 1.0001f);
            EXPECT_LE(std::abs(vv[t] - v0[t]), vmax / 254 * 1.0001f);
          }
        }
      }
    }
    EXPECT_FALSE((*store)->ReadKeys(1, 3, 3, k.data(), pos.data()).ok());  // past the end
    SNAPFILL_ASSERT_OK((*store)->Remove());
    EXPECT_NE(::access(dir.c_str(), F_OK), 0) << "Create made the directory, Remove takes it";
  }
}

// Records already in slot order and format (as a device gathers and
// converts them: here the scalar twins) make the same files as Append's
// gather and conversion of the same rows (here the CPU backend's vector
// kernels), in either format, appended after Append's slots, where the
// layer ends; and read back as the twins decode them.
TEST_F(RecallStoreTest, AppendRecordsWritesWhatAppendWrites) {
  BackendOptions o;
  o.num_threads = 1;
  auto backend = CreateBackend(Device::kCpu, o);
  SNAPFILL_ASSERT_OK(backend);
  for (RecallFormat format : {RecallFormat::kF16, RecallFormat::kQ8}) {
    SCOPED_TRACE(RecallFormatName(format));
    RecallStoreInfo info = Info(format);
    info.head_dim = 40;  // (the vector kernels' wide steps and a tail)
    const int64_t d = info.head_dim, heads = info.num_kv_heads;
    const uint64_t vec = RecallVectorBytes(format, d);
    EXPECT_EQ(vec, format == RecallFormat::kF16 ? 2 * d : 4 + d);
    Candidates c = MakeCandidates(heads, 10, d, 5);
    const std::vector<int32_t> e0 = {1, 4, 7, 3, 8}, e1 = {0, 2, 9, 5, 6};
    const int32_t* idx[2] = {e0.data(), e1.data()};
    const int32_t* idx2[2] = {e0.data() + 2, e1.data() + 2};
    // The same rows in slot order (slot i holds each head's e_h[i]), as
    // records.
    std::vector<uint8_t> k(5 * heads * vec), v(5 * heads * vec);
    std::vector<int32_t> pos(5 * heads);
    for (int64_t i = 0; i < 5; ++i) {
      for (int64_t h = 0; h < heads; ++h) {
        const int32_t r = (h == 0 ? e0 : e1)[i];
        for (auto [from, to] : {std::pair{c.k.data(), k.data()}, std::pair{c.v.data(), v.data()}}) {
          const float* x = from + (h * c.rows + r) * d;
          uint8_t* out = to + (i * heads + h) * vec;
          if (format == RecallFormat::kQ8) {
            EncodeInt8Row(x, d, out);
          } else {
            for (int64_t t = 0; t < d; ++t) {
              const uint16_t half = Fp32ToFp16(x[t]);
              std::memcpy(out + 2 * t, &half, 2);
            }
          }
        }
        pos[i * heads + h] = c.pos[h * c.rows + r];
      }
    }
    const std::string gathered = root_ + "/gathered_" + RecallFormatName(format);
    const std::string slotted = root_ + "/slotted_" + RecallFormatName(format);
    {
      auto a = RecallStore::Create(gathered, info);
      SNAPFILL_ASSERT_OK(a);
      (*a)->SetConversions(RecallStore::BackendConversions(backend->get()));
      SNAPFILL_ASSERT_OK((*a)->Append(2, 2, idx, c.k.data(), c.v.data(), c.rows * d, c.pos.data(), c.rows));
      SNAPFILL_ASSERT_OK((*a)->Append(2, 3, idx2, c.k.data(), c.v.data(), c.rows * d, c.pos.data(), c.rows));
      SNAPFILL_ASSERT_OK((*a)->Sync());
      auto b = RecallStore::Create(slotted, info);
      SNAPFILL_ASSERT_OK(b);
      // (A mix: Append's first slots, then the rest as records.)
      SNAPFILL_ASSERT_OK((*b)->Append(2, 2, idx, c.k.data(), c.v.data(), c.rows * d, c.pos.data(), c.rows));
      SNAPFILL_ASSERT_OK(
          (*b)->AppendRecords(2, 3, pos.data() + 2 * heads, k.data() + 2 * heads * vec, v.data() + 2 * heads * vec));
      SNAPFILL_ASSERT_OK((*b)->AppendRecords(2, 0, nullptr, nullptr, nullptr));
      EXPECT_EQ((*b)->slots(2), 5);
      const absl::Status bad_layer = (*b)->AppendRecords(3, 1, pos.data(), k.data(), v.data());
      EXPECT_EQ(bad_layer.code(), absl::StatusCode::kInvalidArgument) << bad_layer;
      EXPECT_THAT(bad_layer.message(), HasSubstr("layer 3"));
      EXPECT_EQ((*b)->AppendRecords(0, -1, pos.data(), k.data(), v.data()).code(), absl::StatusCode::kInvalidArgument);
      SNAPFILL_ASSERT_OK((*b)->Sync());
      // What it reads back is the records decoded by the twins.
      std::vector<float> keys(5 * heads * d);
      std::vector<int32_t> read_pos(5 * heads);
      SNAPFILL_ASSERT_OK((*b)->ReadKeys(2, 0, 5, keys.data(), read_pos.data()));
      EXPECT_EQ(read_pos, pos);
      for (int64_t i = 0; i < 5 * heads; ++i) {
        std::vector<float> want(d);
        if (format == RecallFormat::kQ8) {
          DecodeInt8Row(k.data() + i * vec, d, want.data());
        } else {
          for (int64_t t = 0; t < d; ++t) {
            uint16_t half;
            std::memcpy(&half, k.data() + i * vec + 2 * t, 2);
            want[t] = Fp16ToFp32(half);
          }
        }
        for (int64_t t = 0; t < d; ++t) ASSERT_EQ(keys[i * d + t], want[t]) << "vector " << i << " dim " << t;
      }
    }
    for (const char* kind : {"pos", "keys", "values"}) {
      const std::string name = std::string("/layer-02.") + kind;
      const std::string want = testing::ReadAll(gathered + name);
      EXPECT_EQ(want.size(),
                5 * (std::string(kind) == "pos" ? heads * sizeof(int32_t)
                                                : (RecallStore::SlotBytes(info) - heads * sizeof(int32_t)) / 2))
          << kind;
      EXPECT_EQ(testing::ReadAll(slotted + name), want) << kind;
    }
  }
}

TEST_F(RecallStoreTest, RefusesADirectoryThatIsNotEmpty) {
  const std::string dir = root_ + "/mine";
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  testing::WriteRaw(dir + "/notes.txt", "keep me");
  auto store = RecallStore::Create(dir, Info());
  ASSERT_FALSE(store.ok());
  EXPECT_THAT(store.status().message(), HasSubstr("is not empty"));
  EXPECT_EQ(testing::ReadAll(dir + "/notes.txt"), "keep me");
  EXPECT_EQ(testing::ListDir(dir), std::vector<std::string>{"notes.txt"});

  // An empty directory of the user's is used, and left in place by Remove.
  const std::string empty = root_ + "/empty";
  ASSERT_EQ(::mkdir(empty.c_str(), 0700), 0);
  auto ok = RecallStore::Create(empty, Info());
  SNAPFILL_ASSERT_OK(ok);
  SNAPFILL_ASSERT_OK((*ok)->Remove());
  EXPECT_EQ(::access(empty.c_str(), F_OK), 0);
  EXPECT_TRUE(testing::ListDir(empty).empty());

  // A file where the directory should be.
  testing::WriteRaw(root_ + "/file", "x");
  auto file = RecallStore::Create(root_ + "/file", Info());
  ASSERT_FALSE(file.ok());
  EXPECT_THAT(file.status().message(), HasSubstr("not a directory"));
}

TEST_F(RecallStoreTest, RefusesAnUnwritableDirectory) {
  if (::geteuid() == 0) {
    // Root writes past modes: sysfs refuses it a new directory all the same.
    auto s = RecallStore::Create("/sys/snapfill-recall-test", Info());
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().code(), absl::StatusCode::kPermissionDenied) << s.status();
    EXPECT_THAT(s.status().message(), HasSubstr("/sys/snapfill-recall-test"));
    return;
  }
  const std::string ro = root_ + "/ro";
  ASSERT_EQ(::mkdir(ro.c_str(), 0500), 0);
  auto inside = RecallStore::Create(ro + "/store", Info());
  ASSERT_FALSE(inside.ok());
  EXPECT_EQ(inside.status().code(), absl::StatusCode::kPermissionDenied) << inside.status();
  EXPECT_THAT(inside.status().message(), HasSubstr(ro + "/store"));
  auto itself = RecallStore::Create(ro, Info());
  ASSERT_FALSE(itself.ok());
  EXPECT_EQ(itself.status().code(), absl::StatusCode::kPermissionDenied) << itself.status();
  EXPECT_TRUE(testing::ListDir(ro).empty());
}

// A file-size limit stands in for a full disk: the write fails with
// EFBIG (SIGXFSZ ignored), and Append says the store ran out of space.
TEST_F(RecallStoreTest, AFullDiskIsAClearError) {
  const RecallStoreInfo info = Info();
  auto store = RecallStore::Create(root_ + "/s", info);
  SNAPFILL_ASSERT_OK(store);
  Candidates c = MakeCandidates(info.num_kv_heads, 64, info.head_dim, 5);
  std::vector<int32_t> rows(64);
  for (int i = 0; i < 64; ++i) rows[i] = i;
  const int32_t* idx[2] = {rows.data(), rows.data()};
  struct rlimit old {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  void (*old_handler)(int) = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old;
  small.rlim_cur = 1000;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  const absl::Status s =
      (*store)->Append(0, 64, idx, c.k.data(), c.v.data(), 64 * info.head_dim, c.pos.data(), 64);
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(s.message(), HasSubstr("ran out of disk"));
  EXPECT_THAT(s.message(), HasSubstr(root_ + "/s/layer-00."));
  EXPECT_EQ((*store)->slots(0), 0);
}

// Reopen cuts each layer back to the checkpoint's slots and refuses the
// store of another model, input or plan.
TEST_F(RecallStoreTest, ReopenTruncatesAndChecksWhoseItIs) {
  const RecallStoreInfo info = Info();
  const std::string dir = root_ + "/s";
  const int64_t d = info.head_dim;
  Candidates c = MakeCandidates(info.num_kv_heads, 6, d, 9);
  std::vector<int32_t> rows = {0, 1, 2, 3, 4, 5};
  const int32_t* idx[2] = {rows.data(), rows.data()};
  {
    auto store = RecallStore::Create(dir, info);
    SNAPFILL_ASSERT_OK(store);
    for (int64_t l = 0; l < 3; ++l) {
      SNAPFILL_ASSERT_OK((*store)->Append(l, 6, idx, c.k.data(), c.v.data(), 6 * d, c.pos.data(), 6));
    }
    SNAPFILL_ASSERT_OK((*store)->Sync());
  }
  for (auto [field, change] :
       std::vector<std::pair<std::string, std::function<void(RecallStoreInfo&)>>>{
           {"another model", [](RecallStoreInfo& i) { i.model_fingerprint = "ffffffffffffffff"; }},
           {"another input", [](RecallStoreInfo& i) { i.input_digest = 43; }},
           {"another plan", [](RecallStoreInfo& i) { i.plan_digest = 8; }},
           {"another shape or format", [](RecallStoreInfo& i) { i.format = RecallFormat::kQ8; }}}) {
    RecallStoreInfo other = info;
    change(other);
    auto s = RecallStore::Reopen(dir, other, {6, 6, 6});
    ASSERT_FALSE(s.ok()) << field;
    EXPECT_THAT(s.status().message(), HasSubstr(field));
  }
  auto more = RecallStore::Reopen(dir, info, {6, 7, 6});
  ASSERT_FALSE(more.ok());
  EXPECT_EQ(more.status().code(), absl::StatusCode::kDataLoss) << more.status();
  auto none = RecallStore::Reopen(root_, info, {6, 6, 6});
  ASSERT_FALSE(none.ok());
  EXPECT_THAT(none.status().message(), HasSubstr("holds no recall store"));

  auto store = RecallStore::Reopen(dir, info, {6, 2, 0});
  SNAPFILL_ASSERT_OK(store);
  EXPECT_EQ((*store)->slots(1), 2);
  struct stat st {};
  ASSERT_EQ(::stat((dir + "/layer-01.keys").c_str(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), 2 * info.num_kv_heads * 2 * d);
  // Appends go on from the cut.
  SNAPFILL_ASSERT_OK((*store)->Append(1, 1, idx, c.k.data(), c.v.data(), 6 * d, c.pos.data(), 6));
  std::vector<float> k(d), v(d);
  int32_t p = -1;
  SNAPFILL_ASSERT_OK((*store)->ReadEntry(1, 1, 2, k.data(), v.data(), &p));
  EXPECT_EQ(p, c.pos[6 + 0]);
  // A fresh Create refuses the directory that holds it.
  auto again = RecallStore::Create(dir, info);
  ASSERT_FALSE(again.ok());
  EXPECT_THAT(again.status().message(), HasSubstr("holds the recall store of an earlier run"));
  SNAPFILL_ASSERT_OK((*store)->Remove());
  EXPECT_NE(::access(dir.c_str(), F_OK), 0);
}

TEST(RecallFormatTest, Parses) {
  EXPECT_EQ(*ParseRecallFormat("f16"), RecallFormat::kF16);
  EXPECT_EQ(*ParseRecallFormat("q8"), RecallFormat::kQ8);
  EXPECT_FALSE(ParseRecallFormat("f32").ok());
}

}  // namespace
}  // namespace snapfill
