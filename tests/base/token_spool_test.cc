#include "src/base/token_spool.h"

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <numeric>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "src/kv/checkpoint_file.h"
#include "tests/testing/files.h"
#include "tests/testing/status_matchers.h"

namespace snapfill {
namespace {

std::vector<int32_t> Ids(int64_t n) {
  std::vector<int32_t> ids(n);
  for (int64_t i = 0; i < n; ++i) ids[i] = static_cast<int32_t>((i * 2654435761u) % 49152);
  return ids;
}

// In memory, past memory_ids on disk, and both ways read back exactly, by
// any range, with the digest of the whole vector.
TEST(TokenSpoolTest, ReadsBackWhatWasAppended) {
  const std::string dir = testing::MakeTempDir("spool");
  const std::vector<int32_t> ids = Ids(700000);
  for (const int64_t memory_ids : {int64_t{0}, int64_t{1000}, int64_t{1} << 22}) {
    TokenSpool spool({dir, memory_ids});
    // Appended in uneven pieces, across the spill and the write buffer.
    for (int64_t at = 0, n = 1; at < static_cast<int64_t>(ids.size()); at += n, n = n * 3 % 100003 + 1) {
      SNAPFILL_ASSERT_OK(spool.Append(ids.data() + at, std::min<int64_t>(n, ids.size() - at)));
    }
    SNAPFILL_ASSERT_OK(spool.Finish());
    EXPECT_EQ(spool.size(), static_cast<int64_t>(ids.size()));
    EXPECT_EQ(spool.on_disk(), memory_ids < static_cast<int64_t>(ids.size())) << memory_ids;
    EXPECT_EQ(spool.digest(), TokenDigest(ids.data(), ids.size()));
    std::vector<int32_t> back(ids.size());
    SNAPFILL_ASSERT_OK(spool.Read(0, back.size(), back.data()));
    EXPECT_EQ(back, ids);
    std::vector<int32_t> part(999);
    SNAPFILL_ASSERT_OK(spool.Read(262000, 999, part.data()));
    EXPECT_TRUE(std::equal(part.begin(), part.end(), ids.begin() + 262000));
    EXPECT_EQ(spool.Read(ids.size() - 5, 6, part.data()).code(), absl::StatusCode::kOutOfRange);
    EXPECT_EQ(spool.Read(-1, 1, part.data()).code(), absl::StatusCode::kOutOfRange);
    if (spool.on_disk()) {
      EXPECT_LE(spool.resident_bytes(), 1u << 20) << "ids on disk leave only the write buffer";
    }
    EXPECT_LE(spool.resident_bytes(), TokenSpool::MaxResidentBytes({dir, memory_ids}));
  }
  EXPECT_TRUE(testing::ListDir(dir).empty()) << "the spool's file has no name";
}

TEST(TokenSpoolTest, AFolderThatCannotTakeItIsNamed) {
  TokenSpool spool({"/nonexistent/snapfill", 0});
  const std::vector<int32_t> ids = Ids(10);
  const absl::Status s = spool.Append(ids);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_NE(s.message().find("cannot create the token spool in /nonexistent/snapfill"), std::string::npos) << s;
  EXPECT_EQ(spool.Append(ids).code(), s.code()) << "the spool stays failed";
}

// A write that cannot grow the file (a file-size limit, in a child process,
// standing in for a full disk) is an error naming the spool, and nothing is
// left in its folder.
TEST(TokenSpoolTest, AFileThatCannotGrowIsAClearError) {
  const std::string dir = testing::MakeTempDir("spool_full");
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::signal(SIGXFSZ, SIG_IGN);
    struct rlimit limit = {64 << 10, 64 << 10};
    ::setrlimit(RLIMIT_FSIZE, &limit);
    TokenSpool spool({dir, 0});
    const std::vector<int32_t> ids = Ids(1 << 20);
    absl::Status s = spool.Append(ids);
    if (s.ok()) s = spool.Finish();
    const bool named = s.message().find("the token spool in " + dir) != std::string_view::npos;
    ::_exit(!s.ok() && named ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the write past the limit must fail, naming the spool";
  EXPECT_TRUE(testing::ListDir(dir).empty());
}

}  // namespace
}  // namespace snapfill
