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
//
// Question-guided (SelectionInput::query_votes, DESIGN.md §7): W shrinks to
// the window's share, its last round((1 - query_share) * w) candidates
// (whole again at the input's last step), and step 4's k entries of R are
// split: round(query_share * k) are picked by the question's pooled votes,
// as single tokens or as spans around its peaks (--select); the rest by the
// window's pooled votes among the entries the question left. Without query
// votes the selection is exactly the above.
//
// The gate and reconstruct pruners are this selection over the entries'
// stored scores instead of the window's votes (pruner.h), step 4 taking
// spans of --score_span entries around the highest (single entries at 1).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "snapfill/backend.h"
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
  SnapKvPruner(const PrunerConfig& config, Backend& backend) : config_(config), backend_(backend) {}

  PrunerKind kind() const override { return config_.kind; }
  bool needs_votes() const override { return true; }

  // The rule is one op (Backend::SelectHeads): its votes are the window's,
  // the entries' stored scores (gate, reconstruct; picked in spans of
  // --score_span), or a question's (each head's own, or their sum read by
  // every head), which the op then reads in their place; where the
  // question leaves the window's votes a share (--query_share < 1), those
  // pick after it (HeadSelection::then_pick, the op's second row).
  bool PlanInBackend(const SelectionInput& in, Backend::HeadSelection* op) const override {
    const bool question = in.query_votes != nullptr;
    if (!RanksByScores(config_.kind) || in.num_kv_heads <= 0) return false;
    const int64_t n = in.num_candidates;
    const int64_t window = EffectiveWindow(config_.window, n - in.num_memory);
    if (in.budget < window || (config_.sink_tokens > 0 && in.positions == nullptr)) return false;
    const absl::StatusOr<int64_t> num_sinks = CountSinks(in, config_.sink_tokens);
    if (!num_sinks.ok() || n - *num_sinks <= in.budget) return false;
    // The window's entries kept as they are (Select's w): under a question
    // only the window's share, except at the input's last step.
    const int64_t w =
        !question || in.final_step ? window : std::llround((1.0 - config_.query_share) * static_cast<double>(window));
    // Positions ascend in every head (the candidate order, pruner.h), so
    // its sinks are its first candidates, all before the window (n - sinks
    // > budget >= window): R is [sinks, n - w) and the window's entries
    // all count against the budget.
    op->num_heads = in.num_kv_heads;
    op->num_candidates = n;
    op->rest_begin = *num_sinks;
    op->window_begin = n - w;
    // R's k entries: the question's share of them first, as Select splits them.
    const int64_t k = in.budget - w;
    const int64_t k_query =
        question ? std::clamp<int64_t>(std::llround(config_.query_share * static_cast<double>(k)), 0, k) : k;
    op->pick = k_query;
    op->then_pick = k - k_query;
    op->pool_kernel = config_.pool_kernel;
    op->pool = config_.pooling == Pooling::kAvg ? Backend::PoolOp::kAvg : Backend::PoolOp::kMax;
    // (Stored scores are picked in spans, as Select's step 4 takes them.)
    op->span = question ? (config_.query_select == Selection::kSpan ? config_.span : 1)
                        : (KeepsEntryScores(config_.kind) ? config_.score_span : 1);
    return true;
  }

  absl::Status Select(const SelectionInput& in, std::vector<std::vector<int32_t>>* keep) override {
    const int64_t sinks_cfg = config_.sink_tokens;
    // The question alone picks when its share is whole: no window votes then.
    const bool question_only = in.query_votes != nullptr && config_.query_share >= 1.0;
    SNAPFILL_RETURN_IF_ERROR(CheckSelectionInput(in, /*needs_votes=*/!question_only, sinks_cfg > 0));
    const int64_t n = in.num_candidates;
    if (in.query_votes != nullptr && in.query_votes_stride < n) {
      return absl::InvalidArgumentError(absl::StrCat("SnapKV: the question's votes have stride ",
                                                     in.query_votes_stride, " for ", n,
                                                     " candidates"));
    }
    const int64_t window = EffectiveWindow(config_.window, n - in.num_memory);
    if (in.budget < window) {
      return absl::InvalidArgumentError(absl::StrCat(
          "SnapKV budget ", in.budget, " is below the window of ", window, " (--window=", config_.window,
          ", chunk of ", n - in.num_memory, " tokens); the window's entries are always kept"));
    }
    // The window's entries kept as they are: all of them, but under a
    // question only the window's share (a question alone keeps no recent
    // entries it did not vote for), except at the last step.
    const int64_t w =
        in.query_votes == nullptr || in.final_step
            ? window
            : std::llround((1.0 - config_.query_share) * static_cast<double>(window));
    SNAPFILL_ASSIGN_OR_RETURN(const int64_t num_sinks, CountSinks(in, sinks_cfg));
    if (n - num_sinks <= in.budget) {
      KeepAll(in, keep);
      return absl::OkStatus();
    }

    const int64_t window_begin = n - w;
    // Shared question votes: one row, the sum over the heads, read by all.
    SelectionInput shared_in;
    const SelectionInput* selection = &in;
    if (in.query_votes != nullptr && config_.shared_query_votes && in.num_kv_heads > 1) {
      shared_votes_.assign(n, 0.0f);
      for (int64_t h = 0; h < in.num_kv_heads; ++h) {
        const float* row = in.query_votes + h * in.query_votes_stride;
        for (int64_t j = 0; j < n; ++j) shared_votes_[j] += row[j];
      }
      shared_in = in;
      shared_in.query_votes = shared_votes_.data();
      shared_in.query_votes_stride = 0;
      selection = &shared_in;
    }
    keep->resize(in.num_kv_heads);
    scratch_.resize(in.num_kv_heads);
    std::vector<absl::Status> status(in.num_kv_heads);
    // One KV head per item, each with scratch of its own, on every thread:
    // the selection then also keeps the threads busy between the votes and
    // the engine's copies of the kept entries (a thread idle for longer
    // waits asleep, and waking it costs more than a head's selection).
    auto select = [&](int64_t h) {
      status[h] = SelectHead(*selection, h, w, window_begin, num_sinks, scratch_[h], (*keep)[h]);
    };
    if (in.num_kv_heads > 1 && n >= kParallelCandidates) {
      backend_.ParallelFor(in.num_kv_heads, select);
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
    std::vector<uint8_t> taken;       // [num_rest] question-guided selection only
  };

  // R's votes from `all` (KV head h's votes over every candidate), in
  // candidate order: read in place without sinks, else gathered into
  // sc.rest_votes. Internal on a non-finite vote.
  absl::StatusOr<const float*> RestVotes(const float* all, int64_t h, int64_t num_rest,
                                         Scratch& sc) const {
    if (config_.sink_tokens <= 0) {
      for (int64_t j = 0; j < num_rest; ++j) {
        if (!std::isfinite(all[j])) return NonFiniteVote(h, j, all[j]);
      }
      return all;
    }
    sc.rest_votes.resize(num_rest);
    for (int64_t i = 0; i < num_rest; ++i) {
      const int32_t j = sc.rest_index[i];
      if (!std::isfinite(all[j])) return NonFiniteVote(h, j, all[j]);
      sc.rest_votes[i] = all[j];
    }
    return sc.rest_votes.data();
  }

  // sc.pooled = pool1d(votes[0, num_rest)) as configured.
  absl::Status Pool(const float* votes, int64_t num_rest, Scratch& sc) const {
    sc.pooled.resize(num_rest);
    return backend_.Pool1d(votes, sc.pooled.data(), num_rest, config_.pool_kernel,
                           config_.pooling == Pooling::kAvg ? Backend::PoolOp::kAvg : Backend::PoolOp::kMax);
  }

  // sc.top = `quota` entries of R by sc.pooled (the question's, or the
  // stored scores), ascending: the highest single entries (span 1), or
  // spans around the highest (Backend::TopSpans).
  absl::Status Pick(int64_t num_rest, int64_t quota, int64_t span, Scratch& sc) const {
    sc.top.resize(quota);
    return backend_.TopSpans(sc.pooled.data(), num_rest, quota, span, sc.top.data());
  }

  // sc.top = the entries of R marked in sc.taken, ascending (k of them).
  static void TakenToTop(int64_t num_rest, int64_t k, Scratch& sc) {
    sc.top.clear();
    for (int64_t i = 0; i < num_rest; ++i) {
      if (sc.taken[i]) sc.top.push_back(static_cast<int32_t>(i));
    }
    SNAPFILL_CHECK(static_cast<int64_t>(sc.top.size()) == k) << "took " << sc.top.size() << " of " << k;
  }

  // Steps 2-4 (see the top of the file) for KV head h, into out.
  absl::Status SelectHead(const SelectionInput& in, int64_t h, int64_t w, int64_t window_begin, int64_t num_sinks,
                          Scratch& sc, std::vector<int32_t>& out) const {
    const int64_t sinks_cfg = config_.sink_tokens;
    const int64_t n = in.num_candidates;
    // R in candidate order with its candidate indices; the window's
    // non-sinks counted. Without sinks R is [0, window_begin) and its
    // indices the identity.
    int64_t num_rest = window_begin, window_non_sinks = w;
    if (sinks_cfg > 0) {
      sc.rest_index.clear();
      window_non_sinks = 0;
      for (int64_t j = 0; j < n; ++j) {
        if (IsSink(in, sinks_cfg, h, j)) continue;
        if (j >= window_begin) {
          ++window_non_sinks;
          continue;
        }
        sc.rest_index.push_back(static_cast<int32_t>(j));
      }
      num_rest = static_cast<int64_t>(sc.rest_index.size());
    }
    const int64_t k = in.budget - window_non_sinks;
    // n - num_sinks > budget, i.e. num_rest + window_non_sinks > budget.
    SNAPFILL_CHECK(k >= 0 && k < num_rest) << "k=" << k << " num_rest=" << num_rest;

    // The question's share of R's k entries, the window's the rest.
    const int64_t k_query =
        in.query_votes == nullptr
            ? 0
            : std::clamp<int64_t>(std::llround(config_.query_share * static_cast<double>(k)), 0, k);
    if (in.query_votes == nullptr) {
      SNAPFILL_ASSIGN_OR_RETURN(const float* rest_votes, RestVotes(in.votes + h * in.votes_stride, h, num_rest, sc));
      SNAPFILL_RETURN_IF_ERROR(Pool(rest_votes, num_rest, sc));
      // Stored scores (gate, reconstruct) picked as spans around their
      // peaks, as a question's are: a kept fact keeps its neighbours.
      SNAPFILL_RETURN_IF_ERROR(Pick(num_rest, k, KeepsEntryScores(config_.kind) ? config_.score_span : 1, sc));
    } else {
      if (k_query > 0) {
        SNAPFILL_ASSIGN_OR_RETURN(const float* query_votes,
                                  RestVotes(in.query_votes + h * in.query_votes_stride, h, num_rest, sc));
        SNAPFILL_RETURN_IF_ERROR(Pool(query_votes, num_rest, sc));
        SNAPFILL_RETURN_IF_ERROR(
            Pick(num_rest, k_query, config_.query_select == Selection::kSpan ? config_.span : 1, sc));
      }
      // (With the whole share, the default, sc.top is already the k.)
      if (k > k_query) {
        sc.taken.assign(num_rest, 0);
        if (k_query > 0) {
          for (int32_t i : sc.top) sc.taken[i] = 1;
        }
        // The window's top among what the question left.
        SNAPFILL_ASSIGN_OR_RETURN(const float* rest_votes, RestVotes(in.votes + h * in.votes_stride, h, num_rest, sc));
        SNAPFILL_RETURN_IF_ERROR(Pool(rest_votes, num_rest, sc));
        for (int64_t i = 0; i < num_rest; ++i) {
          if (sc.taken[i]) sc.pooled[i] = -std::numeric_limits<float>::infinity();
        }
        sc.top.resize(k - k_query);
        SNAPFILL_RETURN_IF_ERROR(backend_.TopK(sc.pooled.data(), num_rest, k - k_query, sc.top.data()));
        for (int32_t i : sc.top) sc.taken[i] = 1;
        TakenToTop(num_rest, k, sc);
      }
    }

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
  Backend& backend_;  // pooling, top-k and the heads' threads
  std::vector<Scratch> scratch_;  // per KV head, reused across calls (one Select at a time)
  std::vector<float> shared_votes_;  // [num_candidates] the heads' question votes summed
};

}  // namespace

std::unique_ptr<Pruner> NewSnapKvPruner(const PrunerConfig& config, Backend& backend) {
  return std::make_unique<SnapKvPruner>(config, backend);
}

}  // namespace snapfill::compress_internal
