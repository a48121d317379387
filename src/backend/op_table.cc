#include "src/backend/op_table.h"

#include "absl/strings/str_format.h"

namespace snapfill {

std::string OpTableReport(const char* const* names, const double* seconds, const int64_t* calls, const double* ops,
                          int n) {
  double total = 0;
  for (int i = 0; i < n; ++i) total += seconds[i];
  std::string out =
      absl::StrFormat("%-14s %10s %8s %8s %12s %10s\n", "op", "seconds", "share", "calls", "GOP", "GOP/s");
  for (int i = 0; i < n; ++i) {
    absl::StrAppendFormat(&out, "%-14s %10.3f %7.1f%% %8d", names[i], seconds[i],
                          total > 0 ? 100 * seconds[i] / total : 0.0, calls[i]);
    if (ops[i] > 0) {
      absl::StrAppendFormat(&out, " %12.1f %10.1f", ops[i] * 1e-9, seconds[i] > 0 ? ops[i] * 1e-9 / seconds[i] : 0.0);
    }
    out += "\n";
  }
  absl::StrAppendFormat(&out, "%-14s %10.3f\n", "backend total", total);
  return out;
}

std::vector<std::pair<std::string, double>> OpTablePairs(const char* const* names, const double* values, int n) {
  std::vector<std::pair<std::string, double>> out;
  for (int i = 0; i < n; ++i) out.emplace_back(names[i], values[i]);
  return out;
}

}  // namespace snapfill
