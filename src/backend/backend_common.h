// What the CPU and the CUDA backend share: the profile's table, the
// attention family's shape checks, and the selection of one head's votes
// in host memory (on kernels/cpu), and gathers done by the host.
#ifndef SNAPFILL_SRC_BACKEND_BACKEND_COMMON_H_
#define SNAPFILL_SRC_BACKEND_BACKEND_COMMON_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "snapfill/backend.h"

namespace snapfill {

// The profile's table, as the backends keep it: per op kind, its seconds,
// calls and work (BackendProfile::Report, Seconds, Ops).

// The table of `n` op kinds: name, seconds, share of the total, calls, and
// GOP and GOP/s where an op counts its work; then the total.
std::string OpTableReport(const char* const* names, const double* seconds, const int64_t* calls, const double* ops,
                          int n);
// (name, value) for each of the n op kinds, in order.
std::vector<std::pair<std::string, double>> OpTablePairs(const char* const* names, const double* values, int n);

// InvalidArgument unless the queries' heads group evenly over their KV
// heads, their rows and the keys fit their strides, and (causal) no more
// queries than keys.
absl::Status CheckQueries(const char* op, const Queries& q, const KvView& kv, bool causal);

// Backend::Pool1d, Backend::TopK and Backend::TopSpans over host memory,
// with their checks, on the CPU's kernels.
absl::Status HostPool1d(const float* in, float* out, int64_t n, int64_t kernel, Backend::PoolOp op);
absl::Status HostTopK(const float* scores, int64_t n, int64_t k, int32_t* positions);
absl::Status HostTopSpans(const float* scores, int64_t n, int64_t k, int64_t span, int32_t* positions);

// Backend::SelectHeads' checks (InvalidArgument naming the size that does
// not fit), and the selection on the host: each head's votes checked,
// pooled and ranked by kernels/cpu, the heads over `backend`'s ParallelFor
// where there are enough candidates to pay for it.
absl::Status CheckHeadSelection(const Backend::HeadSelection& s);
absl::Status HostSelectHeads(const Backend::HeadSelection& s, Backend& backend);

// Backend::Complement's checks (InvalidArgument naming the sizes), and
// the complement on the host: each head's kept indices walked beside the
// candidates, which are checked to be ascending and in range.
absl::Status CheckComplement(const int32_t* keep, int64_t keep_stride, int64_t kept, int64_t num_heads,
                             int64_t num_candidates, const int32_t* out, int64_t out_stride);
absl::Status HostComplement(const int32_t* keep, int64_t keep_stride, int64_t kept, int64_t num_heads,
                            int64_t num_candidates, int32_t* out, int64_t out_stride);

// Backend::GateScores' checks (InvalidArgument naming what does not fit).
absl::Status CheckGateScoring(const Backend::GateScoring& g);

// Backend::Gather's checks (no negative counts, no null ends), and rows
// [r0, r1) of one gather done by the host.
absl::Status CheckGathers(const std::vector<Backend::RowGather>& gathers);
void GatherRows(const Backend::RowGather& r, int64_t r0, int64_t r1);

}  // namespace snapfill

#endif  // SNAPFILL_SRC_BACKEND_BACKEND_COMMON_H_
