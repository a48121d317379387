// Process statistics: wall time and resident memory, read the same way
// everywhere so that figures are comparable (DESIGN.md §7).
#ifndef SNAPFILL_BASE_SYS_STATS_H_
#define SNAPFILL_BASE_SYS_STATS_H_

#include <chrono>
#include <cstdint>

namespace snapfill {

// Returns the process's peak resident set in bytes (VmHWM), 0 if unknown.
uint64_t PeakRssBytes();
// Returns the process's current resident set in bytes (VmRSS), 0 if unknown.
uint64_t CurrentRssBytes();

class Stopwatch {
 public:
  Stopwatch() : start_(std::chrono::steady_clock::now()) {}
  void Reset() { start_ = std::chrono::steady_clock::now(); }
  double Seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  std::chrono::steady_clock::time_point start_;
};

}  // namespace snapfill

#endif  // SNAPFILL_BASE_SYS_STATS_H_
