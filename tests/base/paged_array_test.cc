// PagedArray: zero contents, resident memory only for pages written, and
// Release() gives whole pages back (they read as zero) while partial pages at
// the edges keep their data.
#include "src/base/paged_array.h"

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <utility>

#include "gtest/gtest.h"
#include "src/base/sys_stats.h"

namespace snapfill {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

bool UnderAsan() {
#if defined(__SANITIZE_ADDRESS__)
  return true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  return true;
#endif
#endif
  return false;
}

TEST(PagedArrayTest, StartsZeroAndEmptyMovesOut) {
  PagedArray<int32_t> a;
  EXPECT_TRUE(a.empty());
  ASSERT_TRUE(a.Allocate(1000));
  EXPECT_EQ(a.size(), 1000u);
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], 0) << i;
  a[7] = 42;
  PagedArray<int32_t> b = std::move(a);
  EXPECT_TRUE(a.empty());
  EXPECT_EQ(b[7], 42);
  EXPECT_EQ(b.end() - b.begin(), 1000);
  ASSERT_TRUE(b.Allocate(0));
  EXPECT_TRUE(b.empty());
}

TEST(PagedArrayTest, OnlyWrittenPagesAreResidentAndReleaseGivesThemBack) {
  if (UnderAsan()) GTEST_SKIP() << "AddressSanitizer's shadow memory distorts resident sizes";
  const uint64_t before = CurrentRssBytes();
  PagedArray<float> a;
  ASSERT_TRUE(a.Allocate(256 * kMiB / sizeof(float)));  // 256 MiB of address space
  EXPECT_LT(CurrentRssBytes(), before + 8 * kMiB) << "allocating must not make pages resident";
  // Write the first 64 MiB.
  const size_t n = 64 * kMiB / sizeof(float);
  for (size_t i = 0; i < n; ++i) a[i] = 1.0f;
  const uint64_t written = CurrentRssBytes();
  EXPECT_GT(written, before + 60 * kMiB);
  EXPECT_LT(written, before + 72 * kMiB);
  // Give back the second half of what was written.
  a.ReleaseFrom(n / 2);
  const uint64_t released = CurrentRssBytes();
  EXPECT_LT(released, written - 28 * kMiB);
  EXPECT_EQ(a[n / 2 - 1], 1.0f) << "data before the release point is kept";
  EXPECT_EQ(a[n / 2], 0.0f) << "released pages read as zero";
  EXPECT_EQ(a[n - 1], 0.0f);
}

TEST(PagedArrayTest, ReleaseKeepsPartialPagesAtBothEnds) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t per_page = page / sizeof(int32_t);
  PagedArray<int32_t> a;
  ASSERT_TRUE(a.Allocate(8 * per_page));
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<int32_t>(i + 1);
  // From the middle of page 1 to the middle of page 5: pages 2, 3 and 4 go.
  const size_t first = per_page + per_page / 2, last = 5 * per_page + per_page / 2;
  a.Release(first, last - first);
  for (size_t i = 0; i < a.size(); ++i) {
    const bool gone = i >= 2 * per_page && i < 5 * per_page;
    ASSERT_EQ(a[i], gone ? 0 : static_cast<int32_t>(i + 1)) << "element " << i;
  }
  // Out-of-range and empty releases are harmless.
  a.Release(a.size(), 10);
  a.Release(0, 0);
  a.ReleaseFrom(a.size() + 5);
  EXPECT_EQ(a[0], 1);
}

}  // namespace
}  // namespace snapfill
