// Shared pieces of the pruners (pruner.h): input checks, sink counting and
// the per-kind constructors used by CreatePruner. Not a public API.
#ifndef SNAPFILL_COMPRESS_PRUNER_INTERNAL_H_
#define SNAPFILL_COMPRESS_PRUNER_INTERNAL_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "src/compress/pruner.h"

namespace snapfill::compress_internal {

// Returns InvalidArgument unless `in` is self-consistent: heads >= 1,
// 0 <= num_memory <= num_candidates < 2^31, budget >= 0, and votes /
// positions present with a stride >= num_candidates when required.
absl::Status CheckSelectionInput(const SelectionInput& in, bool needs_votes, bool needs_positions);

// Returns the number of candidates with original position < sink_tokens,
// which must be the same in every KV head (InvalidArgument otherwise: the
// per-head counts would differ after selection). 0 when sink_tokens == 0.
absl::StatusOr<int64_t> CountSinks(const SelectionInput& in, int64_t sink_tokens);

// Whether candidate j of KV head h is a sink.
inline bool IsSink(const SelectionInput& in, int64_t sink_tokens, int64_t h, int64_t j) {
  return sink_tokens > 0 && in.positions[h * in.positions_stride + j] < sink_tokens;
}

// Fills keep with 0..num_candidates-1 for every head.
void KeepAll(const SelectionInput& in, std::vector<std::vector<int32_t>>* keep);

std::unique_ptr<Pruner> NewSnapKvPruner(const PrunerConfig& config, Backend& backend);
std::unique_ptr<Pruner> NewStreamingPruner(const PrunerConfig& config);
std::unique_ptr<Pruner> NewFullPruner(const PrunerConfig& config);

}  // namespace snapfill::compress_internal

#endif  // SNAPFILL_COMPRESS_PRUNER_INTERNAL_H_
