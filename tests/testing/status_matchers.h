// Test helpers for absl::Status.
#ifndef SNAPFILL_TESTS_TESTING_STATUS_MATCHERS_H_
#define SNAPFILL_TESTS_TESTING_STATUS_MATCHERS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"

namespace snapfill::testing {

inline const absl::Status& GetStatus(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& s) {
  return s.status();
}

// Path of a file under the source tree, e.g. SourcePath("tests/data/x.json").
inline std::string SourcePath(const std::string& rel) {
  return std::string(SNAPFILL_SOURCE_DIR) + "/" + rel;
}

}  // namespace snapfill::testing

#define SNAPFILL_EXPECT_OK(expr) \
  EXPECT_TRUE(::snapfill::testing::GetStatus(expr).ok()) << ::snapfill::testing::GetStatus(expr)
#define SNAPFILL_ASSERT_OK(expr) \
  ASSERT_TRUE(::snapfill::testing::GetStatus(expr).ok()) << ::snapfill::testing::GetStatus(expr)

#endif  // SNAPFILL_TESTS_TESTING_STATUS_MATCHERS_H_
