#include "src/base/sys_stats.h"

#include <cstdio>
#include <cstring>

namespace snapfill {
namespace {

// Reads a "Key:   123 kB" line of /proc/self/status.
uint64_t ReadStatusKb(const char* key) {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return 0;
  char line[256];
  uint64_t kb = 0;
  const size_t len = std::strlen(key);
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    if (std::strncmp(line, key, len) == 0 && line[len] == ':') {
      unsigned long long v = 0;
      if (std::sscanf(line + len + 1, "%llu", &v) == 1) kb = v;
      break;
    }
  }
  std::fclose(f);
  return kb * 1024;
}

}  // namespace

uint64_t PeakRssBytes() { return ReadStatusKb("VmHWM"); }
uint64_t CurrentRssBytes() { return ReadStatusKb("VmRSS"); }

}  // namespace snapfill
