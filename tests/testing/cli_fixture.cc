#include "tests/testing/cli_fixture.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>

#include "snapfill/status.h"
#include "tools/testmodel/tiny_llama.h"
#include "tests/testing/files.h"
#include "tests/testing/status_matchers.h"

namespace snapfill::testing {

void CliTest::SetUp() {
  // ctest runs the cases as parallel processes: one folder each.
  dir_ = ::testing::TempDir() + "/snapfill_cli_" +
         ::testing::UnitTest::GetInstance()->current_test_info()->name() + "_" +
         std::to_string(getpid());
  std::system(("rm -rf " + dir_ + " && mkdir -p " + dir_).c_str());
  // The kernels' timings that --kernels auto keeps go to the folder too,
  // not to the user's cache.
  ::setenv("XDG_CACHE_HOME", (dir_ + "/cache").c_str(), 1);
  TinyLlamaOptions opts;
  opts.context_length = 2048;
  auto bytes = MakeTinyLlamaGguf(opts);
  SNAPFILL_ASSERT_OK(bytes);
  tiny_bytes_ = *bytes;
  tiny_ = dir_ + "/tiny.gguf";
  WriteRaw(tiny_, tiny_bytes_);
  text_ = dir_ + "/input.txt";
  std::string text;
  for (int i = 0; i < 400; ++i) text += "The quick brown fox jumps over the lazy dog. ";
  WriteRaw(text_, text);
}

void CliTest::TearDown() { std::system(("rm -rf " + dir_).c_str()); }

Result CliTest::Run(const std::string& args) {
  const std::string out = dir_ + "/stdout", err = dir_ + "/stderr";
  const bool redirects_stdin = args.find(" <") != std::string::npos;
  const std::string cmd = std::string(SNAPFILL_BINARY_DIR) + "/bin/snapfill " + args + " >" +
                          out + " 2>" + err + (redirects_stdin ? "" : " </dev/null");
  const int status = std::system(cmd.c_str());
  Result r;
  if (WIFEXITED(status)) {
    r.exit_code = WEXITSTATUS(status);
    // 128+N is how the shell reports a child killed by signal N; 130 is
    // also snapfill's own exit after SIGINT/SIGTERM, which tests check.
    r.crashed = r.exit_code > 130;
  } else {
    r.crashed = true;
  }
  r.out = ReadAll(out);
  r.err = ReadAll(err);
  return r;
}

pid_t CliTest::Spawn(const std::string& args) {
  const std::string cmd = "exec " + std::string(SNAPFILL_BINARY_DIR) + "/bin/snapfill " + args +
                          " >" + dir_ + "/stdout 2>" + dir_ + "/stderr </dev/null";
  const pid_t pid = ::fork();
  SNAPFILL_CHECK(pid >= 0);
  if (pid == 0) {
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return pid;
}

int CliTest::Wait(pid_t pid) {
  int status = 0;
  SNAPFILL_CHECK(::waitpid(pid, &status, 0) == pid);
  return status;
}

std::string CliTest::Patched(const std::string& name, const std::string& from,
                             const std::string& to) {
  std::string b = tiny_bytes_;
  const size_t at = b.find(from);
  SNAPFILL_CHECK(at != std::string::npos && from.size() == to.size()) << from;
  b.replace(at, from.size(), to);
  const std::string path = dir_ + "/" + name;
  WriteRaw(path, b);
  return path;
}

}  // namespace snapfill::testing
