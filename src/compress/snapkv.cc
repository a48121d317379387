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

// Fewer candidates than this: the heads run one after another on the
// calling thread (a parallel region costs more than they do).
constexpr int64_t kParallelCandidates = 256;

absl::Status NonFiniteVote(int64_t h, int64_t j, float vote) {
  return absl::InternalError(absl::StrCat("SnapKV: vote of KV head ", h, " candidate ", j, " is ", vote,
                                          ", expected a finite value"));
}

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
    scratch_.resize(in.num_kv_heads);
    std::vector<absl::Status> status(in.num_kv_heads);
    // One KV head per item, each with scratch of its own, on every thread:
    // the selection then also keeps the threads busy between the votes and
    // the engine's copies of the kept entries (a thread idle for longer
    // waits asleep, and waking it costs more than a head's selection).
    auto select = [&](int64_t h) {
      status[h] = SelectHead(in, h, w, window_begin, num_sinks, scratch_[h], (*keep)[h]);
    };
    if (in.num_kv_heads > 1 && n >= kParallelCandidates) {
      cpu::ParallelFor(in.num_kv_heads, select);
    } else {
      for (int64_t h = 0; h < in.num_kv_heads; ++h) select(h);
    }
    for (const absl::Status& st : status) SNAPFILL_RETURN_IF_ERROR(st);
    return absl::OkStatus();
  }

 private:
  // Scratch of one KV head's selection.
  struct Scratch {
    std::vector<int32_t> rest_index;  // [num_rest] candidate index of R's i-th entry (with sinks)
    std::vector<float> rest_votes;    // [num_rest] (with sinks)
    std::vector<float> pooled;        // [num_rest]
    std::vector<int32_t> top;         // [k] indices into R, ascending
  };

  // Steps 2-4 (see the top of the file) for KV head h, into out.
  absl::Status SelectHead(const SelectionInput& in, int64_t h, int64_t w, int64_t window_begin, int64_t num_sinks,
                          Scratch& sc, std::vector<int32_t>& out) const {
    const int64_t sinks_cfg = config_.sink_tokens;
    const int64_t n = in.num_candidates;
    const float* votes = in.votes + h * in.votes_stride;
    // R's votes in candidate order and their candidate indices; the
    // window's non-sinks counted. Without sinks R is [0, window_begin),
    // its votes read in place and its indices the identity.
    const float* rest_votes = votes;
    int64_t num_rest = window_begin, window_non_sinks = w;
    if (sinks_cfg <= 0) {
      for (int64_t j = 0; j < num_rest; ++j) {
        if (!std::isfinite(votes[j])) return NonFiniteVote(h, j, votes[j]);
      }
    } else {
      sc.rest_index.clear();
      sc.rest_votes.clear();
      window_non_sinks = 0;
      for (int64_t j = 0; j < n; ++j) {
        if (IsSink(in, sinks_cfg, h, j)) continue;
        if (j >= window_begin) {
          ++window_non_sinks;
          continue;
        }
        if (!std::isfinite(votes[j])) return NonFiniteVote(h, j, votes[j]);
        sc.rest_index.push_back(static_cast<int32_t>(j));
        sc.rest_votes.push_back(votes[j]);
      }
      rest_votes = sc.rest_votes.data();
      num_rest = static_cast<int64_t>(sc.rest_index.size());
    }
    const int64_t k = in.budget - window_non_sinks;
    // n - num_sinks > budget, i.e. num_rest + window_non_sinks > budget.
    SNAPFILL_CHECK(k >= 0 && k < num_rest) << "k=" << k << " num_rest=" << num_rest;

    sc.pooled.resize(num_rest);
    if (config_.pool_kernel <= 1) {
      std::copy(rest_votes, rest_votes + num_rest, sc.pooled.begin());
    } else if (config_.pooling == Pooling::kAvg) {
      cpu::AvgPool1d(rest_votes, sc.pooled.data(), num_rest, config_.pool_kernel);
    } else {
      cpu::MaxPool1d(rest_votes, sc.pooled.data(), num_rest, config_.pool_kernel);
    }
    sc.top.resize(k);
    cpu::TopKIndices(sc.pooled.data(), num_rest, k, sc.top.data());

    // Merge sinks, the top-k of R and the window in ascending order: R's
    // kept entries are sc.rest_index[sc.top[t]], ascending in t; the window
    // is every candidate from window_begin on.
    out.resize(n);  // room for every candidate; cut to what was taken
    int32_t* dst = out.data();
    const int32_t* top = sc.top.data();
    int64_t o = 0;
    if (sinks_cfg <= 0) {  // no sinks: R's entries (R's index is the candidate's), then the window
      for (int64_t t = 0; t < k; ++t) dst[o++] = top[t];
    } else {
      int64_t t = 0;
      for (int64_t j = 0; j < window_begin; ++j) {
        const bool in_top = t < k && sc.rest_index[top[t]] == j;
        t += in_top;
        if (in_top || IsSink(in, sinks_cfg, h, j)) dst[o++] = static_cast<int32_t>(j);
      }
    }
    for (int64_t j = window_begin; j < n; ++j) dst[o++] = static_cast<int32_t>(j);
    out.resize(o);
    SNAPFILL_CHECK(static_cast<int64_t>(out.size()) == in.budget + num_sinks)
        << "kept " << out.size() << ", expected " << in.budget + num_sinks;
    return absl::OkStatus();
  }

  PrunerConfig config_;
  std::vector<Scratch> scratch_;  // per KV head, reused across calls (one Select at a time)
};

}  // namespace

std::unique_ptr<Pruner> NewSnapKvPruner(const PrunerConfig& config) {
  return std::make_unique<SnapKvPruner>(config);
}

}  // namespace snapfill::compress_internal
