// StreamingLLM (Xiao et al., 2023) behind the pruner interface: keep the
// attention sinks (candidates whose original position is < --sinks) and
// the most recent of the rest, `budget` entries in all (DESIGN.md §3: "the
// first s sink keys and the most recent m_i - s"). Candidates are in
// original order, so "most recent" means the highest candidate indices.
// Votes are not needed.
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "snapfill/status.h"
#include "src/compress/pruner.h"
#include "src/compress/pruner_internal.h"

namespace snapfill::compress_internal {
namespace {

class StreamingPruner final : public Pruner {
 public:
  explicit StreamingPruner(const PrunerConfig& config) : config_(config) {}

  PrunerKind kind() const override { return PrunerKind::kStreaming; }
  bool needs_votes() const override { return false; }

  absl::Status Select(const SelectionInput& in, std::vector<std::vector<int32_t>>* keep) override {
    const int64_t sinks_cfg = config_.sink_tokens;
    SNAPFILL_RETURN_IF_ERROR(CheckSelectionInput(in, /*needs_votes=*/false, sinks_cfg > 0));
    const int64_t n = in.num_candidates;
    if (n <= in.budget) {
      KeepAll(in, keep);
      return absl::OkStatus();
    }
    SNAPFILL_ASSIGN_OR_RETURN(const int64_t num_sinks, CountSinks(in, sinks_cfg));
    if (num_sinks > in.budget) {
      return absl::InvalidArgumentError(absl::StrCat("streaming: ", num_sinks,
                                                     " sink entries (--sinks=", sinks_cfg,
                                                     ") do not fit in the budget of ", in.budget));
    }
    const int64_t recent = in.budget - num_sinks;
    keep->resize(in.num_kv_heads);
    for (int64_t h = 0; h < in.num_kv_heads; ++h) {
      std::vector<int32_t>& out = (*keep)[h];
      out.clear();
      out.reserve(in.budget);
      // Walk back from the newest candidate to find where the `recent`
      // non-sink entries begin; everything from there on is kept.
      int64_t begin = n;
      for (int64_t taken = 0; begin > 0 && taken < recent;) {
        --begin;
        if (!IsSink(in, sinks_cfg, h, begin)) ++taken;
      }
      for (int64_t j = 0; j < n; ++j) {
        if (j >= begin || IsSink(in, sinks_cfg, h, j)) out.push_back(static_cast<int32_t>(j));
      }
      SNAPFILL_CHECK(static_cast<int64_t>(out.size()) == in.budget)
          << "kept " << out.size() << ", expected " << in.budget;
    }
    return absl::OkStatus();
  }

 private:
  PrunerConfig config_;
};

}  // namespace

std::unique_ptr<Pruner> NewStreamingPruner(const PrunerConfig& config) {
  return std::make_unique<StreamingPruner>(config);
}

}  // namespace snapfill::compress_internal
