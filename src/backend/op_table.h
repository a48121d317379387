// The profile's table, as the backends keep it: per op kind, its seconds,
// calls and work (BackendProfile::Report, Seconds, Ops). Shared by the CPU
// and the CUDA backend.
#ifndef SNAPFILL_SRC_BACKEND_OP_TABLE_H_
#define SNAPFILL_SRC_BACKEND_OP_TABLE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace snapfill {

// The table of `n` op kinds: name, seconds, share of the total, calls, and
// GOP and GOP/s where an op counts its work; then the total.
std::string OpTableReport(const char* const* names, const double* seconds, const int64_t* calls, const double* ops,
                          int n);
// (name, value) for each of the n op kinds, in order.
std::vector<std::pair<std::string, double>> OpTablePairs(const char* const* names, const double* values, int n);

}  // namespace snapfill

#endif  // SNAPFILL_SRC_BACKEND_OP_TABLE_H_
