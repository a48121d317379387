#include "src/kv/kv_cache.h"

#include <vector>

#include "gtest/gtest.h"
#include "kernels/quant_blocks.h"
#include "snapfill/backend.h"
#include "src/base/sys_stats.h"
#include "tests/testing/status_matchers.h"

namespace snapfill {
namespace {

TEST(KvCacheTest, AppendTransposesTokenMajorToHeadMajor) {
  auto cache = KvCache::Create({/*num_layers=*/2, /*num_kv_heads=*/3, /*head_dim=*/4,
                                /*capacity=*/5});
  SNAPFILL_ASSERT_OK(cache);
  KvCache& kv = **cache;
  // Two tokens, value = 100*token + 10*head + dim (k) and negated (v).
  std::vector<float> k(2 * 12), v(2 * 12);
  for (int t = 0; t < 2; ++t)
    for (int h = 0; h < 3; ++h)
      for (int d = 0; d < 4; ++d) {
        k[t * 12 + h * 4 + d] = 100 * t + 10 * h + d;
        v[t * 12 + h * 4 + d] = -(100 * t + 10 * h + d);
      }
  const int32_t p2[] = {40, 41};
  SNAPFILL_ASSERT_OK(kv.Append(1, k.data(), v.data(), 2, 12, p2));
  SNAPFILL_ASSERT_OK(kv.Append(1, k.data(), v.data(), 1, 12, nullptr));  // token 0 again
  EXPECT_EQ(kv.size(0), 0);
  EXPECT_EQ(kv.size(1), 3);
  for (int h = 0; h < 3; ++h) {
    for (int d = 0; d < 4; ++d) {
      EXPECT_EQ(kv.k(1, h)[0 * 4 + d], 10 * h + d);
      EXPECT_EQ(kv.k(1, h)[1 * 4 + d], 100 + 10 * h + d);
      EXPECT_EQ(kv.k(1, h)[2 * 4 + d], 10 * h + d);
      EXPECT_EQ(kv.v(1, h)[1 * 4 + d], -(100 + 10 * h + d));
    }
  }
  for (int h = 0; h < 3; ++h) {
    EXPECT_EQ(kv.pos(1, h)[0], 40);
    EXPECT_EQ(kv.pos(1, h)[1], 41);
    EXPECT_EQ(kv.pos(1, h)[2], 2);  // no positions given: the entry index
  }
  KvView view = kv.View(1, 3);
  EXPECT_EQ(view.k[2 * view.head_stride + 1 * view.key_stride + 3], 100 + 23);
}

TEST(KvCacheTest, AppendPastCapacityIsOutOfRange) {
  auto cache = KvCache::Create({1, 1, 2, 3});
  SNAPFILL_ASSERT_OK(cache);
  std::vector<float> rows(8, 1.0f);
  SNAPFILL_ASSERT_OK((*cache)->Append(0, rows.data(), rows.data(), 3, 2, nullptr));
  auto s = (*cache)->Append(0, rows.data(), rows.data(), 1, 2, nullptr);
  EXPECT_TRUE(absl::IsOutOfRange(s)) << s;
  EXPECT_EQ((*cache)->size(0), 3);
}

TEST(KvCacheTest, CloneIsDeep) {
  auto cache = KvCache::Create({1, 1, 2, 2});
  SNAPFILL_ASSERT_OK(cache);
  std::vector<float> rows = {1, 2};
  SNAPFILL_ASSERT_OK((*cache)->Append(0, rows.data(), rows.data(), 1, 2, nullptr));
  auto copy = (*cache)->Clone();
  (*cache)->k(0, 0)[0] = 9;
  EXPECT_EQ(copy->k(0, 0)[0], 1);
  EXPECT_EQ(copy->size(0), 1);
}

// The fp16 copy decode attention reads: every entry at the first sync, only
// the appended ones after, each value rounded as Fp32ToFp16 rounds it.
TEST(KvCacheTest, SyncHalfCopiesAllEntriesThenOnlyTheAppendedOnes) {
  const int64_t d = 4, heads = 2;
  auto cache = KvCache::Create({/*num_layers=*/2, heads, d, /*capacity=*/8});
  SNAPFILL_ASSERT_OK(cache);
  KvCache& kv = **cache;
  std::vector<float> k(3 * heads * d), v(3 * heads * d);
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = 0.1f * static_cast<float>(i) + 1e-4f;  // not exact in fp16
    v[i] = -0.37f * static_cast<float>(i);
  }
  SNAPFILL_ASSERT_OK(kv.Append(1, k.data(), v.data(), 3, heads * d, nullptr));
  int64_t converted = 0;
  auto count = [&](const float* x, uint16_t* y, int64_t n) {
    converted += n;
    for (int64_t i = 0; i < n; ++i) y[i] = Fp32ToFp16(x[i]);
  };
  EXPECT_EQ(kv.half_size(1), 0);
  SNAPFILL_ASSERT_OK(kv.SyncHalf(1, count));
  EXPECT_EQ(kv.half_size(1), 3);
  EXPECT_EQ(converted, 2 * 3 * heads * d);  // K and V of 3 entries, both heads
  const KvView view = kv.HalfView(1, 3);
  ASSERT_NE(view.k16, nullptr);
  ASSERT_NE(view.v16, nullptr);
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t j = 0; j < 3; ++j) {
      for (int64_t t = 0; t < d; ++t) {
        const int64_t at = h * view.head_stride + j * view.key_stride + t;
        EXPECT_EQ(view.k16[at], Fp32ToFp16(view.k[at]));
        EXPECT_EQ(view.v16[at], Fp32ToFp16(view.v[at]));
        EXPECT_EQ(view.k[at], k[j * heads * d + h * d + t]);
      }
    }
  }
  // One more token: only its entries are converted.
  converted = 0;
  SNAPFILL_ASSERT_OK(kv.Append(1, k.data(), v.data(), 1, heads * d, nullptr));
  EXPECT_EQ(kv.half_size(1), 3);
  SNAPFILL_ASSERT_OK(kv.SyncHalf(1, count));
  EXPECT_EQ(converted, 2 * heads * d);
  EXPECT_EQ(kv.half_size(1), 4);
  EXPECT_EQ(kv.HalfView(1, 4).k16[3 * d], Fp32ToFp16(k[0]));
  // Nothing new: nothing converted; the other layer has no copy yet.
  converted = 0;
  SNAPFILL_ASSERT_OK(kv.SyncHalf(1, count));
  EXPECT_EQ(converted, 0);
  EXPECT_EQ(kv.half_size(0), 0);
  EXPECT_GT(kv.bytes(), uint64_t{2 * 2 * heads * 8 * d * sizeof(float)});  // the copy counts
}

// Entries reached through writable k() / v(), or cut by set_size(), are
// copied again; the default converter is the portable one.
TEST(KvCacheTest, WritesThroughKOrVAndShrinkingDropTheHalfCopy) {
  auto cache = KvCache::Create({1, 1, 2, 4});
  SNAPFILL_ASSERT_OK(cache);
  KvCache& kv = **cache;
  std::vector<float> rows = {1, 2, 3, 4, 5, 6};
  SNAPFILL_ASSERT_OK(kv.Append(0, rows.data(), rows.data(), 3, 2, nullptr));
  SNAPFILL_ASSERT_OK(kv.SyncHalf(0));
  EXPECT_EQ(kv.half_size(0), 3);
  kv.k(0, 0)[0] = 7.5f;
  EXPECT_EQ(kv.half_size(0), 0);
  SNAPFILL_ASSERT_OK(kv.SyncHalf(0));
  EXPECT_EQ(kv.HalfView(0, 3).k16[0], Fp32ToFp16(7.5f));
  kv.set_size(0, 2);
  EXPECT_EQ(kv.half_size(0), 2);
  kv.v(0, 0)[1] = -1.0f;
  EXPECT_EQ(kv.half_size(0), 0);
  SNAPFILL_ASSERT_OK(kv.SyncHalf(0));
  EXPECT_EQ(kv.HalfView(0, 2).v16[1], Fp32ToFp16(-1.0f));
  kv.Clear();
  EXPECT_EQ(kv.half_size(0), 0);
}

// Decode's fp16 entries replace the f32 ones (release_f32): the f32 pages
// go back to the system, the copy holds every value, and any f32 access
// widens the values back, rounded to fp16.
TEST(KvCacheTest, ReleasedF32EntriesComeBackRoundedOnAccess) {
  constexpr int64_t kMiB = 1 << 20;
  const int64_t d = 64, heads = 2, n = 16384;  // layer 1: 16 MiB of f32 K and V
  auto cache = KvCache::Create({/*num_layers=*/2, heads, d, n});
  SNAPFILL_ASSERT_OK(cache);
  KvCache& kv = **cache;
  const int64_t row = heads * d;
  std::vector<float> k(1024 * row), v(1024 * row);
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = 0.001f * static_cast<float>(i % 5000) + 1e-5f;  // not exact in fp16
    v[i] = -0.0037f * static_cast<float>(i % 3001);
  }
  for (int64_t t = 0; t < n; t += 1024) SNAPFILL_ASSERT_OK(kv.Append(1, k.data(), v.data(), 1024, row, nullptr));
  const uint64_t before = CurrentRssBytes();
  SNAPFILL_ASSERT_OK(kv.SyncHalf(1, {}, /*release_f32=*/true));
  const uint64_t released = CurrentRssBytes();
  EXPECT_EQ(kv.half_size(1), n);
  EXPECT_EQ(kv.f32_released(1), n);
  EXPECT_EQ(kv.f32_released(0), 0);
  EXPECT_FALSE(kv.half_overflow());
  // 16 MiB of f32 out, 8 MiB of fp16 in.
  EXPECT_LT(released + 6 * kMiB, before) << "the f32 pages were not given back";
  const KvView half = kv.HalfView(1, n);
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t j : {int64_t{0}, int64_t{777}, n - 1}) {
      for (int64_t t = 0; t < d; ++t) {
        const int64_t at = h * half.head_stride + j * half.key_stride + t;
        const int64_t src = (j % 1024) * row + h * d + t;
        EXPECT_EQ(half.k16[at], Fp32ToFp16(k[src]));
        EXPECT_EQ(half.v16[at], Fp32ToFp16(v[src]));
      }
    }
  }
  // Read access widens the layer back: fp16-rounded values, not zeros.
  const KvCache& ro = kv;
  const float* k1 = ro.k(1, 1);
  EXPECT_EQ(kv.f32_released(1), 0);
  EXPECT_EQ(kv.half_size(1), n);  // the copy still holds them
  for (int64_t j : {int64_t{0}, int64_t{5000}, n - 1}) {
    for (int64_t t = 0; t < d; ++t) {
      const float want = k[(j % 1024) * row + d + t];
      EXPECT_EQ(k1[j * d + t], Fp16ToFp32(Fp32ToFp16(want)));
      EXPECT_NE(k1[j * d + t], want) << "still the f32 value: nothing was released";
    }
  }
  EXPECT_EQ(kv.View(1, n).v[3 * d + 1], Fp16ToFp32(Fp32ToFp16(v[3 * row + 1])));
  EXPECT_GT(CurrentRssBytes(), released + 6 * kMiB) << "widening back makes the f32 pages resident";
}

// Entries appended while decoding go back in batches of 256 (each release
// interrupts the other threads); until then their f32 values stay exact.
TEST(KvCacheTest, AppendedEntriesAreReleasedInBatches) {
  const int64_t d = 64;
  auto cache = KvCache::Create({1, 1, d, 1024});
  SNAPFILL_ASSERT_OK(cache);
  KvCache& kv = **cache;
  std::vector<float> rows(400 * d);  // (rows 100..354 are appended below)
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = 1.0f + 1e-4f * static_cast<float>(i % 97);
  SNAPFILL_ASSERT_OK(kv.Append(0, rows.data(), rows.data(), 100, d, nullptr));
  SNAPFILL_ASSERT_OK(kv.SyncHalf(0, {}, true));
  EXPECT_EQ(kv.f32_released(0), 100);
  for (int i = 0; i < 255; ++i) {
    SNAPFILL_ASSERT_OK(kv.Append(0, rows.data() + (100 + i) * d, rows.data(), 1, d, nullptr));
    SNAPFILL_ASSERT_OK(kv.SyncHalf(0, {}, true));
  }
  EXPECT_EQ(kv.half_size(0), 355);
  EXPECT_EQ(kv.f32_released(0), 100);  // 255 pending
  SNAPFILL_ASSERT_OK(kv.Append(0, rows.data(), rows.data(), 1, d, nullptr));
  SNAPFILL_ASSERT_OK(kv.SyncHalf(0, {}, true));
  EXPECT_EQ(kv.f32_released(0), 356);
  // Shrinking below the released entries keeps the count within size.
  kv.set_size(0, 50);
  EXPECT_EQ(kv.f32_released(0), 50);
  EXPECT_EQ(kv.half_size(0), 50);
  const float* k = static_cast<const KvCache&>(kv).k(0, 0);
  EXPECT_EQ(k[49 * d + 5], Fp16ToFp32(Fp32ToFp16(rows[49 * d + 5])));
  EXPECT_EQ(kv.f32_released(0), 0);
  kv.Clear();
  EXPECT_EQ(kv.f32_released(0), 0);
}

// A value fp16 cannot hold: the copy is not fit to read, nothing is
// released, and the f32 entries stay exact. Clear starts afresh.
TEST(KvCacheTest, ValuesTooLargeForFp16KeepTheF32Entries) {
  auto cache = KvCache::Create({2, 1, 4, 8});
  SNAPFILL_ASSERT_OK(cache);
  KvCache& kv = **cache;
  std::vector<float> rows = {1.0f, 70000.0f, 3.0f, 4.0f};
  SNAPFILL_ASSERT_OK(kv.Append(0, rows.data(), rows.data(), 1, 4, nullptr));
  SNAPFILL_ASSERT_OK(kv.Append(1, rows.data(), rows.data(), 1, 4, nullptr));
  SNAPFILL_ASSERT_OK(kv.SyncHalf(0, {}, true));
  EXPECT_TRUE(kv.half_overflow());
  EXPECT_EQ(kv.f32_released(0), 0);
  SNAPFILL_ASSERT_OK(kv.SyncHalf(1, {}, true));
  EXPECT_EQ(kv.f32_released(1), 0);
  EXPECT_EQ(static_cast<const KvCache&>(kv).k(0, 0)[1], 70000.0f);
  kv.Clear();
  EXPECT_FALSE(kv.half_overflow());
  std::vector<float> small = {1.0f, 2.0f, 3.0f, 4.0f};
  SNAPFILL_ASSERT_OK(kv.Append(0, small.data(), small.data(), 1, 4, nullptr));
  SNAPFILL_ASSERT_OK(kv.SyncHalf(0, {}, true));
  EXPECT_FALSE(kv.half_overflow());
  EXPECT_EQ(kv.f32_released(0), 1);
}

// Keys and values in a backend's buffers (the CPU's under guard_buffers,
// out of the host's reach as a device's are): appended through the
// backend, read back with CopyOut, cloned in the same place, viewed at the
// backend's addresses, counted in bytes(); no fp16 copy.
TEST(KvCacheTest, KeysAndValuesInABackendsBuffers) {
  BackendOptions o;
  o.guard_buffers = true;
  auto backend = CreateBackend(Device::kCpu, o);
  SNAPFILL_ASSERT_OK(backend);
  ASSERT_FALSE((*backend)->HostReachesBuffers());
  auto cache = KvCache::Create({/*num_layers=*/2, /*num_kv_heads=*/2, /*head_dim=*/4, /*capacity=*/3}, backend->get());
  SNAPFILL_ASSERT_OK(cache);
  KvCache& kv = **cache;
  EXPECT_FALSE(kv.on_host());
  EXPECT_EQ(kv.storage(), backend->get());
  EXPECT_GE(kv.bytes(), uint64_t{2} * 2 * 2 * 3 * 4 * sizeof(float));
  // Two tokens, token-major [2, 2 heads, 4].
  std::vector<float> k(16), v(16);
  for (int i = 0; i < 16; ++i) {
    k[i] = static_cast<float>(i);
    v[i] = -static_cast<float>(i);
  }
  const int32_t pos[] = {7, 9};
  SNAPFILL_ASSERT_OK(kv.Append(1, k.data(), v.data(), 2, 8, pos));
  EXPECT_EQ(kv.size(1), 2);
  EXPECT_EQ(kv.pos(1, 1)[1], 9);  // (positions stay on the host)
  std::vector<float> got_k(8), got_v(8);
  SNAPFILL_ASSERT_OK(kv.CopyOut(1, 1, 2, got_k.data(), got_v.data()));
  EXPECT_EQ(got_k, (std::vector<float>{4, 5, 6, 7, 12, 13, 14, 15}));
  EXPECT_EQ(got_v, (std::vector<float>{-4, -5, -6, -7, -12, -13, -14, -15}));
  EXPECT_TRUE(absl::IsOutOfRange(kv.CopyOut(1, 1, 4, got_k.data(), got_v.data())));
  EXPECT_EQ(kv.View(1, 2).k, kv.k(1, 0));
  const std::unique_ptr<KvCache> copy = kv.Clone();
  EXPECT_FALSE(copy->on_host());
  EXPECT_NE(copy->k(1, 1), kv.k(1, 1));
  std::vector<float> copied_k(8), copied_v(8);
  SNAPFILL_ASSERT_OK(copy->CopyOut(1, 1, 2, copied_k.data(), copied_v.data()));
  EXPECT_EQ(copied_k, got_k);
  EXPECT_EQ(copied_v, got_v);
  EXPECT_TRUE(absl::IsFailedPrecondition(kv.SyncHalf(1)));
}

// A cache read from a file goes to a device once (generate --cache on
// cuda): the same entries, positions, scores and sizes, in the backend's
// buffers.
TEST(KvCacheTest, CopiesToABackendsBuffers) {
  BackendOptions o;
  o.guard_buffers = true;
  auto backend = CreateBackend(Device::kCpu, o);
  SNAPFILL_ASSERT_OK(backend);
  auto host = KvCache::Create({/*num_layers=*/2, /*num_kv_heads=*/2, /*head_dim=*/4, /*capacity=*/5});
  SNAPFILL_ASSERT_OK(host);
  SNAPFILL_ASSERT_OK((*host)->EnableScores());
  std::vector<float> k(24), v(24);
  for (int i = 0; i < 24; ++i) {
    k[i] = static_cast<float>(i) + 0.5f;
    v[i] = -static_cast<float>(i);
  }
  const int32_t pos[] = {3, 8, 11};
  SNAPFILL_ASSERT_OK((*host)->Append(0, k.data(), v.data(), 3, 8, pos));
  SNAPFILL_ASSERT_OK((*host)->Append(1, k.data(), v.data(), 1, 8, pos));
  (*host)->score(0, 1)[2] = 0.25f;
  auto moved = (*host)->CopyToBackend(backend->get());
  SNAPFILL_ASSERT_OK(moved);
  const KvCache& kv = **moved;
  EXPECT_FALSE(kv.on_host());
  EXPECT_EQ(kv.size(0), 3);
  EXPECT_EQ(kv.size(1), 1);
  EXPECT_EQ(kv.room(), 2);
  EXPECT_EQ(kv.score(0, 1)[2], 0.25f);
  for (int64_t l = 0; l < 2; ++l) {
    for (int64_t h = 0; h < 2; ++h) {
      const int64_t n = kv.size(l);
      std::vector<float> want_k(n * 4), want_v(n * 4), got_k(n * 4), got_v(n * 4);
      SNAPFILL_ASSERT_OK((*host)->CopyOut(l, h, n, want_k.data(), want_v.data()));
      SNAPFILL_ASSERT_OK(kv.CopyOut(l, h, n, got_k.data(), got_v.data()));
      EXPECT_EQ(got_k, want_k) << l << " " << h;
      EXPECT_EQ(got_v, want_v) << l << " " << h;
      EXPECT_TRUE(std::equal(kv.pos(l, h), kv.pos(l, h) + n, (*host)->pos(l, h)));
    }
  }
  EXPECT_TRUE(absl::IsFailedPrecondition(kv.CopyToBackend(backend->get()).status()));
}

TEST(KvCacheTest, BadShapesAreRefused) {
  EXPECT_TRUE(absl::IsInvalidArgument(KvCache::Create({0, 1, 1, 1}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(KvCache::Create({1, 1, 64, -1}).status()));
  EXPECT_TRUE(absl::IsResourceExhausted(KvCache::Create({1 << 10, 64, 128, 1 << 20}).status()));
}

}  // namespace
}  // namespace snapfill
