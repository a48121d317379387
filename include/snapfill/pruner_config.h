// What the memory keeps and how a question's votes pick it: the pruners'
// configuration (src/compress/pruner.h has the pruners), part of the
// engine's public configuration (snapfill/engine.h).
#ifndef SNAPFILL_PRUNER_CONFIG_H_
#define SNAPFILL_PRUNER_CONFIG_H_

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"

namespace snapfill {

enum class PrunerKind { kSnapKv, kStreaming, kFull, kReconstruct, kGate };
enum class Pooling { kAvg, kMax };
// How the question's votes pick entries (question-guided compression):
// single tokens by pooled vote, or spans around the highest pooled votes
// (every token within span/2 of a picked peak), so that a kept fact keeps
// all its tokens (a number is one token per digit in SmolLM2's vocabulary).
enum class Selection { kToken, kSpan };
// How the question's tokens' weights on an entry combine into its vote
// (DESIGN.md §7): summed over the tokens and averaged over the KV group's
// query heads (SnapKV's rule), or the largest weight any token gives it in
// any of the group's heads, so that an entry one token attends to strongly
// (a name the question asks about) ranks with one that every token attends
// to a little. docs/RESULTS.md measures both on RULER's multi-key task.
enum class QueryVotes { kSum, kMax };

struct PrunerConfig {
  PrunerKind kind = PrunerKind::kSnapKv;
  // SnapKV observation window: votes come from the last `window` queries of
  // the chunk (min(window, chunk size) when the chunk is shorter). --window
  int64_t window = 32;
  // 1-D pooling kernel over the votes: odd, >= 1; 1 = no pooling.
  // Stride 1, padding kernel/2. --pool_kernel
  int64_t pool_kernel = 7;
  // Avg counts the pads as zeros (PyTorch count_include_pad); max ignores
  // them. --pooling
  Pooling pooling = Pooling::kAvg;
  // Tokens of the input with original position < sink_tokens are pinned
  // (see the header comment for how each pruner counts them). --sinks
  int64_t sink_tokens = 0;
  // Question-guided compression (SnapKV only; used when the engine passes
  // SelectionInput::query_votes). The window's share of the chunk's last w
  // entries stays pinned, round((1 - query_share) * w) of them (all of
  // them at the input's last step); of the entries an evicting step picks
  // beyond those and the sinks, round(query_share * k) are chosen by the
  // question's votes and the rest by the chunk's own window votes, among
  // those the question did not take. --query_share
  double query_share = 1.0;
  // How the question's share is picked (the window's is always by token,
  // so a run without a question selects exactly as SnapKV). --select, --span
  Selection query_select = Selection::kSpan;
  int64_t span = 32;
  // The question's votes summed over a layer's KV heads, so that every head
  // keeps what any of them found (the heads that answer need not be those
  // that voted), or each head's own. --query_heads shared|each
  bool shared_query_votes = false;
  // --query_votes sum|max (see QueryVotes). The engine computes the votes;
  // the recall tier scores the stored entries by the same rule.
  QueryVotes query_votes = QueryVotes::kSum;
  // Context reconstruction: the repetition takes every repeat_stride-th
  // token of the chunk (1: the whole chunk; 2 halves the extra rows, the
  // cheaper variant). --repeat_stride
  int64_t repeat_stride = 1;
  // The pruners that rank by stored scores (gate, reconstruct): keep spans
  // of this many entries around the highest scores, as the question's
  // spans do (a 7-digit key is 8 tokens), or single entries with 1.
  // --score_span
  int64_t score_span = 8;
};

// "snapkv" | "streaming" | "full" | "reconstruct" | "gate"; InvalidArgument otherwise.
absl::StatusOr<PrunerKind> ParsePrunerKind(std::string_view name);
// "avg" | "max"; InvalidArgument otherwise.
absl::StatusOr<Pooling> ParsePooling(std::string_view name);
// "token" | "span"; InvalidArgument otherwise.
absl::StatusOr<Selection> ParseSelection(std::string_view name);
// "sum" | "max"; InvalidArgument otherwise.
absl::StatusOr<QueryVotes> ParseQueryVotes(std::string_view name);
const char* PrunerKindName(PrunerKind kind);
const char* PoolingName(Pooling pooling);
const char* SelectionName(Selection selection);
const char* QueryVotesName(QueryVotes votes);

}  // namespace snapfill

#endif  // SNAPFILL_PRUNER_CONFIG_H_
