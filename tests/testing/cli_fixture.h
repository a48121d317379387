// A fixture for tests of the snapfill command: a private folder with a tiny
// random model (no download) and a text input, and Run() / Spawn() of the
// built binary. EXPECT_FAILS_WITH checks a refusal: no crash, the exit
// code, and text in stderr.
#ifndef SNAPFILL_TESTS_TESTING_CLI_FIXTURE_H_
#define SNAPFILL_TESTS_TESTING_CLI_FIXTURE_H_

#include <sys/types.h>

#include <string>

#include "gtest/gtest.h"

namespace snapfill::testing {

struct Result {
  int exit_code = -1;
  bool crashed = false;  // killed by a signal (exit code >= 128 from the shell)
  std::string out;
  std::string err;
};

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;

  // Runs `snapfill <args>` through the shell (stdin from /dev/null unless
  // `args` redirects it) and waits.
  Result Run(const std::string& args);
  // Starts `snapfill <args>` (stdout and stderr to files in the folder) and
  // returns its pid; Wait() reaps it.
  pid_t Spawn(const std::string& args);
  // The raw wait status of a spawned process.
  int Wait(pid_t pid);

  // The tiny model with `from` replaced by `to` (same length) once.
  std::string Patched(const std::string& name, const std::string& from, const std::string& to);

  std::string dir_, tiny_, tiny_bytes_, text_;
};

}  // namespace snapfill::testing

#define EXPECT_FAILS_WITH(r, code, text)                                        \
  do {                                                                         \
    EXPECT_FALSE((r).crashed) << (r).err;                                      \
    EXPECT_EQ((r).exit_code, code) << (r).err;                                 \
    EXPECT_NE((r).err.find(text), std::string::npos) << "stderr: " << (r).err; \
  } while (0)

#endif  // SNAPFILL_TESTS_TESTING_CLI_FIXTURE_H_
