// SnapKV selection inside the chunk loop (DESIGN.md §3; Li et al., 2024,
// FasterDecoding/SnapKV `snapkv_utils.py`):
//   1. window W = the last w = min(window, c) candidates (the chunk's last
//      w tokens, whose queries produced the votes);
//   2. the rest R = the non-window, non-sink candidates, in candidate order;
//   3. pooled = pool1d(votes[R]) (avg or max, stride 1, padding kernel/2),
//      computed over R alone, as the paper pools attn[..., :-window] so
//      that the window's own votes do not leak into its neighbours;
//   4. per KV head, keep the top (budget - |W \ sinks|) of R by pooled vote
//      (higher score, then lower index), plus W, plus the sinks.
// The budget counts non-sink entries, so an evicting step keeps exactly
// budget + (#sinks) per head. Nothing is evicted when the non-sink
// candidates fit in the budget.
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cpu/ops.h"
#include "snapfill/status.h"
#include "src/compress/pruner.h"
#include "src/compress/pruner_internal.h"

namespace snapfill::compress_internal {
namespace {

class SnapKvPruner final : public Pruner {
 public:
  explicit SnapKvPruner(const PrunerConfig& config) : config_(config) {}

  PrunerKind kind() const override { return PrunerKind::kSnapKv; }
  bool needs_votes() const override { return true; }

  absl::Status Select(const SelectionInput& in, std::vector<std::vector<int32_t>>* keep) override {
    const int64_t sinks_cfg = config_.sink_tokens;
    SNAPFILL_RETURN_IF_ERROR(CheckSelectionInput(in, /*needs_votes=*/true, sinks_cfg > 0));
    const int64_t n = in.num_candidates;
    const int64_t w = EffectiveWindow(config_.window, n - in.num_memory);
    if (in.budget < w) {
      return absl::InvalidArgumentError(absl::StrCat(
          "SnapKV budget ", in.budget, " is below the window of ", w, " (--window=", config_.window,
          ", chunk of ", n - in.num_memory, " tokens); the window's entries are always kept"));
    }
    SNAPFILL_ASSIGN_OR_RETURN(const int64_t num_sinks, CountSinks(in, sinks_cfg));
    if (n - num_sinks <= in.budget) {
      KeepAll(in, keep);
      return absl::OkStatus();
    }

    const int64_t window_begin = n - w;
    keep->resize(in.num_kv_heads);
    for (int64_t h = 0; h < in.num_kv_heads; ++h) {
      const float* votes = in.votes + h * in.votes_stride;
      // Gather R's votes in candidate order; count the window's non-sinks.
      rest_index_.clear();
      rest_votes_.clear();
      int64_t window_non_sinks = 0;
      for (int64_t j = 0; j < n; ++j) {
        if (IsSink(in, sinks_cfg, h, j)) continue;
        if (j >= window_begin) {
          ++window_non_sinks;
          continue;
        }
        if (!std::isfinite(votes[j])) {
          return absl::InternalError(absl::StrCat("SnapKV: vote of KV head ", h, " candidate ", j,
                                                  " is ", votes[j], ", expected a finite value"));
        }
        rest_index_.push_back(static_cast<int32_t>(j));
        rest_votes_.push_back(votes[j]);
      }
      const int64_t num_rest = static_cast<int64_t>(rest_index_.size());
      const int64_t k = in.budget - window_non_sinks;
      // n - num_sinks > budget, i.e. num_rest + window_non_sinks > budget.
      SNAPFILL_CHECK(k >= 0 && k < num_rest) << "k=" << k << " num_rest=" << num_rest;

      pooled_.resize(num_rest);
      if (config_.pool_kernel <= 1) {
        pooled_ = rest_votes_;
      } else if (config_.pooling == Pooling::kAvg) {
        cpu::AvgPool1d(rest_votes_.data(), pooled_.data(), num_rest, config_.pool_kernel);
      } else {
        cpu::MaxPool1d(rest_votes_.data(), pooled_.data(), num_rest, config_.pool_kernel);
      }
      top_.resize(k);
      cpu::TopKIndices(pooled_.data(), num_rest, k, top_.data());

      // Merge sinks, the top-k of R and the window in ascending order.
      std::vector<int32_t>& out = (*keep)[h];
      out.clear();
      out.reserve(in.budget + num_sinks);
      size_t t = 0;
      for (int64_t j = 0; j < n; ++j) {
        const bool take = j >= window_begin || IsSink(in, sinks_cfg, h, j) ||
                          (t < top_.size() && rest_index_[top_[t]] == j);
        if (t < top_.size() && rest_index_[top_[t]] == j) ++t;
        if (take) out.push_back(static_cast<int32_t>(j));
      }
      SNAPFILL_CHECK(static_cast<int64_t>(out.size()) == in.budget + num_sinks)
          << "kept " << out.size() << ", expected " << in.budget + num_sinks;
    }
    return absl::OkStatus();
  }

 private:
  PrunerConfig config_;
  // Scratch reused across calls (one Select at a time).
  std::vector<int32_t> rest_index_;  // [num_rest] candidate index of R's i-th entry
  std::vector<float> rest_votes_;    // [num_rest]
  std::vector<float> pooled_;        // [num_rest]
  std::vector<int32_t> top_;         // [k] indices into R, ascending
};

}  // namespace

std::unique_ptr<Pruner> NewSnapKvPruner(const PrunerConfig& config) {
  return std::make_unique<SnapKvPruner>(config);
}

}  // namespace snapfill::compress_internal
