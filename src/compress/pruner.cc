// Pruner configuration, parsing, the factory and the checks all pruners
// share.
#include "src/compress/pruner.h"

#include <cstdint>
#include <limits>
#include <memory>
#include <numeric>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "snapfill/status.h"
#include "src/compress/pruner_internal.h"

namespace snapfill {

absl::Status ValidatePrunerConfig(const PrunerConfig& config) {
  switch (config.kind) {
    case PrunerKind::kSnapKv:
    case PrunerKind::kStreaming:
    case PrunerKind::kFull:
    case PrunerKind::kReconstruct:
    case PrunerKind::kGate:
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("--pruner: unknown pruner kind ", static_cast<int>(config.kind)));
  }
  if (config.window < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--window=", config.window, " must be >= 1"));
  }
  if (config.pool_kernel < 1 || config.pool_kernel % 2 == 0) {
    return absl::InvalidArgumentError(absl::StrCat("--pool_kernel=", config.pool_kernel,
                                                   " must be odd and >= 1 (1 = no pooling)"));
  }
  if (config.pooling != Pooling::kAvg && config.pooling != Pooling::kMax) {
    return absl::InvalidArgumentError(
        absl::StrCat("--pooling: unknown pooling ", static_cast<int>(config.pooling)));
  }
  if (config.sink_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--sinks=", config.sink_tokens, " must be >= 0"));
  }
  if (!(config.query_share >= 0.0 && config.query_share <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--query_share=", config.query_share, " must be in [0, 1]"));
  }
  if (config.query_select != Selection::kToken && config.query_select != Selection::kSpan) {
    return absl::InvalidArgumentError(
        absl::StrCat("--select: unknown selection ", static_cast<int>(config.query_select)));
  }
  if (config.score_span < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--score_span=", config.score_span, " must be >= 1"));
  }
  if (config.repeat_stride < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--repeat_stride=", config.repeat_stride, " must be >= 1"));
  }
  if (config.span < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--span=", config.span, " must be >= 1"));
  }
  return absl::OkStatus();
}

absl::Status ValidatePrunerBudget(const PrunerConfig& config, int64_t budget) {
  switch (config.kind) {
    case PrunerKind::kSnapKv:
    case PrunerKind::kReconstruct:
    case PrunerKind::kGate:
      if (budget < config.window) {
        return absl::InvalidArgumentError(absl::StrCat(PrunerKindName(config.kind), " budget ", budget,
                                                       " must be >= --window=", config.window,
                                                       " (the window's entries are always kept)"));
      }
      break;
    case PrunerKind::kStreaming:
      if (budget < 1 || budget < config.sink_tokens) {
        return absl::InvalidArgumentError(absl::StrCat(
            "streaming budget ", budget, " must be >= 1 and >= --sinks=", config.sink_tokens,
            " (its sinks count inside the budget)"));
      }
      break;
    case PrunerKind::kFull:
      break;
  }
  return absl::OkStatus();
}

int64_t KeptCapacity(const PrunerConfig& config, int64_t budget) {
  return RanksByScores(config.kind) ? budget + config.sink_tokens : budget;
}

absl::StatusOr<PrunerKind> ParsePrunerKind(std::string_view name) {
  if (name == "snapkv") return PrunerKind::kSnapKv;
  if (name == "streaming") return PrunerKind::kStreaming;
  if (name == "full") return PrunerKind::kFull;
  if (name == "reconstruct") return PrunerKind::kReconstruct;
  if (name == "gate") return PrunerKind::kGate;
  return absl::InvalidArgumentError(absl::StrCat("--pruner=", std::string(name),
                                                 ": expected snapkv, streaming, full, reconstruct or gate"));
}

absl::StatusOr<Pooling> ParsePooling(std::string_view name) {
  if (name == "avg") return Pooling::kAvg;
  if (name == "max") return Pooling::kMax;
  return absl::InvalidArgumentError(
      absl::StrCat("--pooling=", std::string(name), ": expected avg or max"));
}

absl::StatusOr<Selection> ParseSelection(std::string_view name) {
  if (name == "token") return Selection::kToken;
  if (name == "span") return Selection::kSpan;
  return absl::InvalidArgumentError(
      absl::StrCat("--select=", std::string(name), ": expected token or span"));
}

absl::StatusOr<QueryVotes> ParseQueryVotes(std::string_view name) {
  if (name == "sum") return QueryVotes::kSum;
  if (name == "max") return QueryVotes::kMax;
  return absl::InvalidArgumentError(
      absl::StrCat("--query_votes=", std::string(name), ": expected sum or max"));
}

const char* PrunerKindName(PrunerKind kind) {
  switch (kind) {
    case PrunerKind::kSnapKv:
      return "snapkv";
    case PrunerKind::kStreaming:
      return "streaming";
    case PrunerKind::kFull:
      return "full";
    case PrunerKind::kReconstruct:
      return "reconstruct";
    case PrunerKind::kGate:
      return "gate";
  }
  return "unknown";
}

const char* PoolingName(Pooling pooling) {
  switch (pooling) {
    case Pooling::kAvg:
      return "avg";
    case Pooling::kMax:
      return "max";
  }
  return "unknown";
}

const char* SelectionName(Selection selection) {
  switch (selection) {
    case Selection::kToken:
      return "token";
    case Selection::kSpan:
      return "span";
  }
  return "unknown";
}

const char* QueryVotesName(QueryVotes votes) {
  switch (votes) {
    case QueryVotes::kSum:
      return "sum";
    case QueryVotes::kMax:
      return "max";
  }
  return "unknown";
}

absl::StatusOr<std::unique_ptr<Pruner>> CreatePruner(const PrunerConfig& config, Backend& backend) {
  SNAPFILL_RETURN_IF_ERROR(ValidatePrunerConfig(config));
  switch (config.kind) {
    case PrunerKind::kSnapKv:
    case PrunerKind::kReconstruct:
    case PrunerKind::kGate:
      return compress_internal::NewSnapKvPruner(config, backend);
    case PrunerKind::kStreaming:
      return compress_internal::NewStreamingPruner(config);
    case PrunerKind::kFull:
      return compress_internal::NewFullPruner(config);
  }
  return absl::InternalError("unreachable pruner kind");
}

namespace compress_internal {

absl::Status CheckSelectionInput(const SelectionInput& in, bool needs_votes, bool needs_positions) {
  if (in.num_kv_heads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("pruner: num_kv_heads=", in.num_kv_heads, ", expected >= 1"));
  }
  if (in.num_candidates < 0 || in.num_candidates > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("pruner: num_candidates=", in.num_candidates, ", expected in [0, 2^31)"));
  }
  if (in.num_memory < 0 || in.num_memory > in.num_candidates) {
    return absl::InvalidArgumentError(
        absl::StrCat("pruner: num_memory=", in.num_memory,
                     ", expected in [0, num_candidates=", in.num_candidates, "]"));
  }
  if (in.budget < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("pruner: budget=", in.budget, ", expected >= 0"));
  }
  if (needs_votes && (in.votes == nullptr || in.votes_stride < in.num_candidates)) {
    return absl::InvalidArgumentError(
        absl::StrCat("pruner: needs votes for ", in.num_candidates, " candidates, got ",
                     in.votes == nullptr ? "none" : absl::StrCat("stride ", in.votes_stride)));
  }
  if (needs_positions && (in.positions == nullptr || in.positions_stride < in.num_candidates)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pruner: --sinks needs the positions of ", in.num_candidates, " candidates, got ",
        in.positions == nullptr ? "none" : absl::StrCat("stride ", in.positions_stride)));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> CountSinks(const SelectionInput& in, int64_t sink_tokens) {
  if (sink_tokens <= 0) return 0;
  int64_t first = -1;
  for (int64_t h = 0; h < in.num_kv_heads; ++h) {
    int64_t count = 0;
    for (int64_t j = 0; j < in.num_candidates; ++j) count += IsSink(in, sink_tokens, h, j);
    if (h == 0) {
      first = count;
    } else if (count != first) {
      return absl::InvalidArgumentError(absl::StrCat(
          "pruner: KV head 0 has ", first, " sink candidates (position < --sinks=", sink_tokens,
          ") but KV head ", h, " has ", count, "; every head must hold the same sinks"));
    }
  }
  return first;
}

void KeepAll(const SelectionInput& in, std::vector<std::vector<int32_t>>* keep) {
  keep->resize(in.num_kv_heads);
  for (auto& head : *keep) {
    head.resize(in.num_candidates);
    std::iota(head.begin(), head.end(), 0);
  }
}

}  // namespace compress_internal
}  // namespace snapfill
