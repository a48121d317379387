#include "src/kv/kv_cache.h"

#include <vector>

#include "gtest/gtest.h"
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

TEST(KvCacheTest, BadShapesAreRefused) {
  EXPECT_TRUE(absl::IsInvalidArgument(KvCache::Create({0, 1, 1, 1}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(KvCache::Create({1, 1, 64, -1}).status()));
  EXPECT_TRUE(absl::IsResourceExhausted(KvCache::Create({1 << 10, 64, 128, 1 << 20}).status()));
}

}  // namespace
}  // namespace snapfill
