#include "tests/testing/files.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>

#include "gtest/gtest.h"
#include "snapfill/status.h"

namespace snapfill::testing {

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteRaw(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << data;
}

namespace {

// The folders MakeTempDir made, removed when the test binary exits (only by
// the process that made them: a forked child's exit leaves them), so that
// runs do not pile folders up in /tmp. SNAPFILL_KEEP_TEST_FILES=1 keeps
// them, to look at after a failure.
struct TempDirs {
  std::mutex mu;
  pid_t owner = ::getpid();
  std::vector<std::string> dirs;
};
TempDirs& Made() {
  static TempDirs* made = [] {
    auto* m = new TempDirs;
    std::atexit([] {
      TempDirs& t = Made();
      if (::getpid() != t.owner || std::getenv("SNAPFILL_KEEP_TEST_FILES") != nullptr) return;
      std::lock_guard<std::mutex> lock(t.mu);
      for (const std::string& d : t.dirs) {
        std::error_code ec;
        std::filesystem::remove_all(d, ec);
      }
    });
    return m;
  }();
  return *made;
}

}  // namespace

std::string MakeTempDir(const std::string& stem) {
  std::string tmpl = ::testing::TempDir() + "/" + stem + ".XXXXXX";
  SNAPFILL_CHECK(::mkdtemp(tmpl.data()) != nullptr);
  TempDirs& made = Made();
  std::lock_guard<std::mutex> lock(made.mu);
  made.dirs.push_back(tmpl);
  return tmpl;
}

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return names;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

uint64_t MappedResidentBytes(const void* data, uint64_t bytes) {
  const auto page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uint64_t>(data) / page;
  const auto end = (reinterpret_cast<uint64_t>(data) + bytes + page - 1) / page;
  const int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  uint64_t present = 0;
  std::vector<uint64_t> entries(4096);
  for (uint64_t p = begin; p < end; p += entries.size()) {
    const uint64_t n = std::min<uint64_t>(entries.size(), end - p);
    if (pread(fd, entries.data(), n * 8, static_cast<off_t>(p * 8)) != static_cast<ssize_t>(n * 8)) break;
    for (uint64_t i = 0; i < n; ++i) present += (entries[i] >> 63) & 1;
  }
  close(fd);
  return present * page;
}

}  // namespace snapfill::testing
