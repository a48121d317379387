// KV pruners of the chunked prefill: after each chunk, every layer's
// candidate set (its memory followed by the chunk's KV) is cut down to the
// step's budget, and only the kept entries survive into the next chunk
// (DESIGN.md §2-§3). This module owns the selection rule only: given the
// window votes and original positions of the candidates, it returns which
// candidate indices each KV head keeps. The engine computes the votes (a
// separate pass over the window queries, cpu::WindowScores; never a full
// attention matrix) and gathers the kept entries into the new memory.
//
// Pruners:
//   snapkv    SnapKV (Li et al., 2024; FasterDecoding/SnapKV
//             `snapkv_utils.py`): window votes -> 1-D pooling over the
//             non-window candidates -> per-head top-k -> + the window.
//   streaming StreamingLLM: the first s "sink" tokens + the most recent.
//   full      no eviction (the baseline).
//   reconstruct
//             context reconstruction (KVzip; DESIGN.md §9): SnapKV's
//             selection (window, sinks, pooling, top-k) over scores each
//             entry got once, when its own chunk was repeated after a
//             "repeat the previous text" prompt, and keeps while it is
//             kept. The engine passes those scores as SelectionInput::votes.
//   gate      SmartKV (shared/seeds; gate.h): the same selection over each
//             entry's lifespan as a learned gate predicts it from its key
//             before RoPE, also kept with the entry.
//
// Candidate order: in every KV head, candidates [0, num_memory) are the
// memory in original order and [num_memory, num_candidates) the chunk, so
// a higher candidate index always means a later original position.
//
// Sinks (--sinks = s): candidates whose ORIGINAL position is < s.
//   snapkv:    pinned OUTSIDE the budget. The budget counts the kept
//              non-sink entries, so a step that evicts keeps exactly
//              budget + (sinks present) entries per head. Sinks take no
//              part in pooling or top-k: pooling runs over the non-sink,
//              non-window candidates in candidate order, so a sink's
//              (typically huge) vote does not lift its neighbours. A sink
//              that falls inside the window counts as a sink, not against
//              the budget.
//   streaming: INSIDE the budget (DESIGN.md §3: "the first s sink keys and
//              the most recent m_i - s"), so it keeps exactly `budget`.
//   full:      keeps everything anyway.
// Use KeptCapacity() to size the memory for a budget.
//
// Every pruner returns, per KV head, strictly ascending candidate indices,
// the same count for every head, and is deterministic (ties in SnapKV are
// broken by higher pooled vote, then lower candidate index, as on every
// backend: STYLE.md §6).
#ifndef SNAPFILL_COMPRESS_PRUNER_H_
#define SNAPFILL_COMPRESS_PRUNER_H_

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "snapfill/backend.h"
#include "snapfill/pruner_config.h"

namespace snapfill {

// Whether the pruner ranks by SnapKV's rule (window, sinks, pooling,
// top-k) over scores the engine gives it as SelectionInput::votes.
inline bool RanksByScores(PrunerKind kind) {
  return kind == PrunerKind::kSnapKv || kind == PrunerKind::kReconstruct || kind == PrunerKind::kGate;
}
// Whether the pruner's scores are given once, when an entry arrives, and
// kept with the entry (KvCache entry scores) rather than recomputed.
inline bool KeepsEntryScores(PrunerKind kind) {
  return kind == PrunerKind::kReconstruct || kind == PrunerKind::kGate;
}

// Returns InvalidArgument naming the flag (--window, --pool_kernel,
// --sinks, --query_share, --span, --repeat_stride, --score_span) when a
// value is out of range.
absl::Status ValidatePrunerConfig(const PrunerConfig& config);

// Returns InvalidArgument unless `budget` (entries kept per head per step,
// the schedule's m_i) can hold the observation window for SnapKV
// (budget >= --window) and is >= 1 for the other pruners (full ignores it).
absl::Status ValidatePrunerBudget(const PrunerConfig& config, int64_t budget);

// Returns the most entries per KV head that a step with `budget` can keep:
// budget + sink_tokens for SnapKV and reconstruct (sinks are outside their
// budget), budget for streaming. For full it returns budget: the engine must give full a budget
// of at least the whole input, which it then never exceeds.
int64_t KeptCapacity(const PrunerConfig& config, int64_t budget);

// Returns the window actually used for a chunk of `chunk_size` tokens:
// min(window, chunk_size). The engine computes votes for exactly that many
// trailing queries.
inline int64_t EffectiveWindow(int64_t window, int64_t chunk_size) {
  return window < chunk_size ? window : chunk_size;
}

// One layer's candidates at one step. Non-owning.
struct SelectionInput {
  int64_t num_kv_heads = 0;
  int64_t num_candidates = 0;  // m + c
  int64_t num_memory = 0;      // m: [0, m) memory, [m, m + c) the chunk
  // Entries to keep per head (the schedule's m_i); see the header comment
  // for how sinks count.
  int64_t budget = 0;
  // [num_kv_heads][votes_stride], entry (h, j) = KV head h's window vote
  // for candidate j (cpu::WindowScores over all m + c candidates with the
  // last EffectiveWindow(window, c) chunk queries). Read only by pruners
  // whose needs_votes() is true; entries of window candidates are unused.
  // May be null when query_votes is given and PrunerConfig::query_share
  // is 1 (the question picks everything).
  const float* votes = nullptr;
  int64_t votes_stride = 0;
  // [num_kv_heads][query_votes_stride]: the question's votes for each
  // candidate (the question's tokens placed after the chunk, their queries
  // voting over memory ∪ chunk ∪ question; only the first num_candidates
  // are read). Null without a question.
  const float* query_votes = nullptr;
  int64_t query_votes_stride = 0;
  // The input's last step: its chunk ends with the tokens the decoder goes
  // on from (in `run`, the question and the assistant's turn), so SnapKV
  // keeps its window whatever the question's share.
  bool final_step = false;
  // [num_kv_heads][positions_stride], original position of each candidate.
  // Read only when sink_tokens > 0 (may be null otherwise).
  const int32_t* positions = nullptr;
  int64_t positions_stride = 0;
};

class Pruner {
 public:
  virtual ~Pruner() = default;
  virtual PrunerKind kind() const = 0;
  // Whether Select reads SelectionInput::votes (the engine can skip the
  // window-vote pass otherwise).
  virtual bool needs_votes() const = 0;

  // Writes to *keep one vector per KV head ([num_kv_heads][kept]) of the
  // candidate indices to keep, strictly ascending, the same count for
  // every head. Returns InvalidArgument for an inconsistent input (sizes,
  // missing votes/positions, a budget below the window, sinks that differ
  // in count across heads) and Internal for a non-finite vote; *keep is
  // unspecified after an error. Reuses internal scratch, so one Pruner
  // must not run Select concurrently.
  virtual absl::Status Select(const SelectionInput& in,
                              std::vector<std::vector<int32_t>>* keep) = 0;

  // Whether Select's rule for this input is one Backend::SelectHeads:
  // SnapKV's rule (snapkv, gate, reconstruct), evicting, with its sinks (if
  // any) before the window. Then *op holds that op's arguments but for the
  // votes and the kept indices, which the engine places in the backend's
  // memory, so that neither comes to the host (DESIGN.md §14): op->votes
  // are the question's where query_votes is set (with shared_query_votes,
  // their sum over the heads, which every head reads: votes_stride 0), else
  // the window's (the stored scores, for gate and reconstruct); where a question leaves
  // the window's votes a share (query_share < 1), those are op->then_votes,
  // picking op->then_pick entries after it. The op keeps the entries Select
  // would, op->count() of them per head. No votes are read (query_votes
  // only says there is a question). False for every other input (Select
  // then reports what is wrong with it) and pruner.
  virtual bool PlanInBackend(const SelectionInput& in, Backend::HeadSelection* op) const { return false; }
};

// Returns the pruner for `config` (validated first). SnapKV runs its pooling,
// top-k and per-head threads on `backend`, which must outlive the pruner.
absl::StatusOr<std::unique_ptr<Pruner>> CreatePruner(const PrunerConfig& config, Backend& backend);

}  // namespace snapfill

#endif  // SNAPFILL_COMPRESS_PRUNER_H_
