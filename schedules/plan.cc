// PlanSchedule: validation of a ScheduleConfig, assembly of the plan from the
// chunking (fixed.cc, incremental_decremental.cc) and the growth
// (incremental.cc), the plan's statistics, and its --dry_run table.
#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "schedules/schedule_internal.h"
#include "snapfill/schedule.h"
#include "snapfill/status.h"

namespace snapfill {
namespace schedule_internal {

Core ComputeCore(const ScheduleConfig& config) {
  Core core;
  const bool imdc = config.kind == ScheduleKind::kIncrementalDecremental;
  if (!imdc) core.chunks = FixedChunks(config.total_tokens, config.chunk, config.window);
  const int64_t n = imdc ? CeilDiv(config.total_tokens, config.chunk)
                         : static_cast<int64_t>(core.chunks.size());
  if (config.kind == ScheduleKind::kFixed || n == 1) {
    core.first_memory = config.memory;
  } else if (config.first_memory > 0) {
    core.first_memory = config.first_memory;
  } else {
    // The paper's m_max / n, but never below the window: SnapKV always keeps
    // the w window keys, so a smaller budget could not be honoured.
    core.first_memory = std::max(config.window, config.memory / n);
  }
  const int64_t big_n = config.num_layers;
  core.budgets =
      Budgets(config.kind, config.growth, n, core.first_memory, config.memory, big_n);
  if (imdc) {
    std::vector<int64_t> step_memory(n, 0);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t l = 0; l < big_n; ++l) step_memory[i] += core.budgets[i * big_n + l];
    }
    core.chunks = ImdcChunks(config.total_tokens, step_memory, big_n, config.sink_tokens,
                             config.window, &core.tail_extra);
  }
  for (int64_t i = 0; i < n && core.bad_step < 0; ++i) {
    const int64_t c = core.chunks[i];
    if (c <= config.window || (i == 0 && c < config.sink_tokens + config.window)) {
      core.bad_step = i;
    }
  }
  return core;
}

}  // namespace schedule_internal

namespace {

using schedule_internal::CeilDiv;

constexpr int64_t kMaxTokens = int64_t{1} << 40;
constexpr int64_t kMaxMemory = int64_t{1} << 32;
constexpr int64_t kMaxLayers = int64_t{1} << 16;
constexpr int64_t kMaxPlanEntries = int64_t{1} << 26;  // steps × layers budgets

absl::Status Invalid(std::string msg) { return absl::InvalidArgumentError(std::move(msg)); }

absl::Status Validate(const ScheduleConfig& c) {
  if (c.total_tokens < 0) {
    return Invalid(absl::StrCat("input length ", c.total_tokens, " is negative"));
  }
  if (c.total_tokens == 0) return Invalid("empty input: 0 tokens to prefill");
  if (c.total_tokens > kMaxTokens) {
    return Invalid(absl::StrCat("input of ", c.total_tokens, " tokens exceeds the planner's limit of ",
                                kMaxTokens));
  }
  if (c.window < 1) {
    return Invalid(absl::StrCat("--window=", c.window, " must be >= 1"));
  }
  if (c.total_tokens <= c.window) {
    return Invalid(absl::StrCat("input of ", c.total_tokens, " tokens is at or below --window=",
                                c.window,
                                ": the observation window needs a longer chunk; use --window < ",
                                c.total_tokens));
  }
  if (c.chunk <= c.window) {
    return Invalid(absl::StrCat("--chunk=", c.chunk, " must be > --window=", c.window,
                                " (every chunk must be longer than the observation window); use "
                                "--chunk >= ",
                                c.window + 1, " or a smaller --window"));
  }
  if (c.chunk > kMaxTokens) {
    return Invalid(absl::StrCat("--chunk=", c.chunk, " exceeds the planner's limit of ", kMaxTokens));
  }
  if (c.memory < c.window) {
    return Invalid(absl::StrCat("--memory=", c.memory, " must be >= --window=", c.window,
                                " (SnapKV always keeps the window's keys)"));
  }
  if (c.memory > kMaxMemory) {
    return Invalid(
        absl::StrCat("--memory=", c.memory, " exceeds the planner's limit of ", kMaxMemory));
  }
  if (c.first_memory < 0) {
    return Invalid(absl::StrCat("--first_memory=", c.first_memory, " must be >= 0 (0 = default)"));
  }
  if (c.first_memory > 0 && c.first_memory < c.window) {
    return Invalid(absl::StrCat("--first_memory=", c.first_memory, " must be >= --window=",
                                c.window, " (or 0 for the default)"));
  }
  if (c.first_memory > c.memory) {
    return Invalid(absl::StrCat("--first_memory=", c.first_memory, " must be <= --memory=",
                                c.memory));
  }
  if (c.num_layers < 1 || c.num_layers > kMaxLayers) {
    return Invalid(absl::StrCat("number of layers ", c.num_layers, " must be in [1, ", kMaxLayers,
                                "]"));
  }
  if (c.sink_tokens < 0) {
    return Invalid(absl::StrCat("--sink_tokens=", c.sink_tokens, " must be >= 0"));
  }
  if (c.max_position < 0) {
    return Invalid(absl::StrCat("max position ", c.max_position, " must be >= 0 (0 = unknown)"));
  }
  const int64_t n = CeilDiv(c.total_tokens, c.chunk);
  if (n > kMaxPlanEntries / c.num_layers) {
    return Invalid(absl::StrCat(n, " chunks of --chunk=", c.chunk, " over ", c.num_layers,
                                " layers exceed the planner's limit of ", kMaxPlanEntries,
                                " budgets; use a larger --chunk"));
  }
  return absl::OkStatus();
}

// Fills attention lengths, memory statistics and live-KV peaks. `kept` is the
// memory a layer actually holds: its budget, or less while the input has not
// supplied that many tokens yet.
void FillStatistics(SchedulePlan& plan) {
  const ScheduleConfig& c = plan.config;
  const int64_t big_n = c.num_layers;
  const int64_t s = c.sink_tokens;
  const int64_t n = static_cast<int64_t>(plan.steps.size());
  std::vector<int64_t> prev(big_n, 0);
  std::vector<int64_t> kept(big_n, 0);
  double memory_sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    ScheduleStep& step = plan.steps[i];
    const int64_t chunk = step.chunk_tokens;
    const int64_t max_prev = *std::max_element(prev.begin(), prev.end());
    step.attention_length = i == 0 ? chunk : s + max_prev + chunk;
    int64_t prev_total = 0;
    for (int64_t l = 0; l < big_n; ++l) {
      // Step 0's sinks are pinned outside the budget.
      kept[l] = std::min(step.budget[l], i == 0 ? chunk - s : prev[l] + chunk);
      prev_total += prev[l];
    }
    // While layer j compresses: layers below j hold their new memory, layer j
    // its old memory plus the chunk, layers above their old memory.
    int64_t kept_below = 0;
    int64_t prev_below = 0;
    for (int64_t j = 0; j < big_n; ++j) {
      const int64_t sinks = i == 0 ? j * s : big_n * s;
      const int64_t live = kept_below + (prev_total - prev_below) + chunk + sinks;
      plan.peak_kv_slots = std::max(plan.peak_kv_slots, live);
      kept_below += kept[j];
      prev_below += prev[j];
    }
    plan.peak_attention_length = std::max(plan.peak_attention_length, step.attention_length);
    plan.max_chunk_tokens = std::max(plan.max_chunk_tokens, chunk);
    if (i + 1 < n || n == 1) {
      for (int64_t l = 0; l < big_n; ++l) memory_sum += static_cast<double>(step.budget[l]);
    }
    prev.swap(kept);
  }
  plan.mean_memory = memory_sum / static_cast<double>(std::max<int64_t>(n - 1, 1) * big_n);
}

void AddWarnings(SchedulePlan& plan, const ScheduleConfig& given, int64_t tail_extra) {
  const ScheduleConfig& c = plan.config;
  if (c.kind == ScheduleKind::kFixed && given.growth != Growth::kLinear) {
    plan.warnings.push_back(
        absl::StrCat("--growth=", std::string(GrowthName(given.growth)), " has no effect with --schedule=fm"));
  }
  if (c.kind == ScheduleKind::kFixed && given.first_memory > 0 &&
      given.first_memory != given.memory) {
    plan.warnings.push_back("--first_memory has no effect with --schedule=fm");
  }
  if (c.max_position > 0) {
    for (size_t i = 0; i < plan.steps.size(); ++i) {
      if (plan.steps[i].attention_length > c.max_position) {
        plan.warnings.push_back(absl::StrCat(
            "step ", i, " attends over ", plan.steps[i].attention_length,
            " keys (sinks + memory + chunk), beyond the model's trained context of ",
            c.max_position, " positions (peak ", plan.peak_attention_length,
            "); positions restart at 0 every step, so keep --sink_tokens + --memory + --chunk <= ",
            c.max_position));
        break;
      }
    }
  }
  if (tail_extra > 0) {
    plan.warnings.push_back(absl::StrCat(
        "IMDC: ", plan.steps.size(), " chunks for ", c.total_tokens,
        " tokens leave a rounding remainder that only fits by giving the last ", tail_extra,
        " chunks one extra token each (attention length varies by 1); a larger --chunk avoids "
        "this"));
  }
}

}  // namespace

absl::StatusOr<SchedulePlan> PlanSchedule(const ScheduleConfig& config) {
  if (config.total_tokens > 0 && config.total_tokens <= config.window) {
    // An input no longer than the observation window has nothing to
    // compress: one chunk, kept whole. Every other setting must still be
    // valid for a real input.
    ScheduleConfig longer = config;
    longer.total_tokens = config.window + 1;
    SNAPFILL_RETURN_IF_ERROR(Validate(longer));
    SchedulePlan plan;
    plan.config = config;
    ScheduleStep step;
    step.chunk_tokens = config.total_tokens;
    step.budget.assign(config.num_layers, config.total_tokens);
    plan.steps.push_back(std::move(step));
    FillStatistics(plan);
    plan.warnings.push_back(absl::StrCat("the input of ", config.total_tokens,
                                         " tokens is not longer than --window=", config.window,
                                         ": it is read in one chunk and kept whole"));
    return plan;
  }
  SNAPFILL_RETURN_IF_ERROR(Validate(config));
  const schedule_internal::Core core = schedule_internal::ComputeCore(config);
  if (core.bad_step >= 0) {
    if (config.kind == ScheduleKind::kIncrementalDecremental) {
      return Invalid(schedule_internal::ImdcRefusal(config, core));
    }
    return Invalid(absl::StrCat("--sink_tokens=", config.sink_tokens, " and --window=",
                                config.window, " need ", config.sink_tokens + config.window,
                                " tokens but the first chunk has ", core.chunks[0],
                                "; use --chunk >= ", config.sink_tokens + config.window,
                                " or fewer sinks"));
  }
  SchedulePlan plan;
  plan.config = config;
  plan.config.first_memory = core.first_memory;
  plan.adaptive = config.kind != ScheduleKind::kFixed && config.growth == Growth::kAdaptive;
  const int64_t n = static_cast<int64_t>(core.chunks.size());
  const int64_t big_n = config.num_layers;
  plan.steps.resize(n);
  int64_t start = 0;
  for (int64_t i = 0; i < n; ++i) {
    ScheduleStep& step = plan.steps[i];
    step.start_token = start;
    step.chunk_tokens = core.chunks[i];
    step.budget.assign(core.budgets.begin() + i * big_n, core.budgets.begin() + (i + 1) * big_n);
    start += step.chunk_tokens;
  }
  SNAPFILL_CHECK(start == config.total_tokens) << "chunks cover " << start << " of "
                                               << config.total_tokens << " tokens";
  if (config.keep_last_chunk) {
    // Every layer held at most m_{n−2} <= m_{n−1} entries before the last
    // chunk (none before a first and only one): with its c_{n−1} added to
    // the budget nothing is evicted. (Adaptive growth redistributes the
    // earlier budgets; its engine keeps each layer's memory as it is and the
    // chunk, within the room the memory leaves for it, PrefillEngine.)
    ScheduleStep& last = plan.steps.back();
    for (int64_t& b : last.budget) b += last.chunk_tokens;
  }
  FillStatistics(plan);
  AddWarnings(plan, config, core.tail_extra);
  return plan;
}

double PredictedSpeedup(double attention_share, double max_memory, double mean_memory,
                        double chunk) {
  return attention_share * ((max_memory + chunk) / (mean_memory + chunk) - 1.0) + 1.0;
}

std::string FormatPlan(const SchedulePlan& plan, int max_rows) {
  const ScheduleConfig& c = plan.config;
  std::string out = absl::StrFormat(
      "schedule %s (growth %s): %d tokens, --chunk=%d, --memory=%d, first memory %d, "
      "--window=%d, %d layers, %d sink tokens\n",
      ScheduleKindName(c.kind), GrowthName(c.growth), c.total_tokens, c.chunk, c.memory,
      c.first_memory, c.window, c.num_layers, c.sink_tokens);
  absl::StrAppendFormat(&out, "%6s %12s %8s %12s %17s %10s\n", "step", "start", "chunk",
                        "memory mean", "memory min-max", "attention");
  const int64_t n = static_cast<int64_t>(plan.steps.size());
  const int64_t rows = max_rows <= 0 ? n : std::min<int64_t>(n, max_rows);
  const int64_t head = (rows + 1) / 2;
  const int64_t tail_begin = n - (rows - head);
  for (int64_t i = 0; i < n; ++i) {
    if (i == head && head < tail_begin) {
      absl::StrAppendFormat(&out, "%6s ... %d steps not shown\n", "", tail_begin - head);
      i = tail_begin - 1;
      continue;
    }
    const ScheduleStep& step = plan.steps[i];
    int64_t lo = step.budget.empty() ? 0 : step.budget[0];
    int64_t hi = lo;
    double sum = 0;
    for (int64_t b : step.budget) {
      lo = std::min(lo, b);
      hi = std::max(hi, b);
      sum += static_cast<double>(b);
    }
    const double mean = step.budget.empty() ? 0 : sum / static_cast<double>(step.budget.size());
    absl::StrAppendFormat(&out, "%6d %12d %8d %12.1f %17s %10d\n", i, step.start_token,
                          step.chunk_tokens, mean, absl::StrCat(lo, "-", hi),
                          step.attention_length);
  }
  absl::StrAppendFormat(&out,
                        "summary: %d steps over %d tokens; mean memory m^ %.1f; peak attention "
                        "length %d; largest chunk %d; peak KV slots %d (per KV head, all layers)\n",
                        n, c.total_tokens, plan.mean_memory, plan.peak_attention_length,
                        plan.max_chunk_tokens, plan.peak_kv_slots);
  if (c.keep_last_chunk) {
    absl::StrAppend(&out, "the last step keeps its chunk whole beside the memory (--keep_last_chunk)\n");
  }
  if (plan.adaptive) {
    absl::StrAppend(&out,
                    "adaptive: memory shows the linear budgets; each step redistributes their "
                    "total over layers by measured retention\n");
  }
  for (const std::string& w : plan.warnings) absl::StrAppend(&out, "warning: ", w, "\n");
  return out;
}

absl::StatusOr<ScheduleKind> ParseScheduleKind(std::string_view name) {
  if (name == "fm" || name == "fixed") return ScheduleKind::kFixed;
  if (name == "im" || name == "incremental") return ScheduleKind::kIncremental;
  if (name == "imdc" || name == "incremental_decremental") {
    return ScheduleKind::kIncrementalDecremental;
  }
  return Invalid(absl::StrCat("unknown --schedule='", std::string(name),
                              "': expected fm, im or imdc"));
}

absl::StatusOr<Growth> ParseGrowth(std::string_view name) {
  if (name == "linear") return Growth::kLinear;
  if (name == "sqrt") return Growth::kSqrt;
  if (name == "square") return Growth::kSquare;
  if (name == "square_sqrt" || name == "square-sqrt") return Growth::kSquareSqrt;
  if (name == "adaptive") return Growth::kAdaptive;
  return Invalid(absl::StrCat("unknown --growth='", std::string(name),
                              "': expected linear, sqrt, square, square_sqrt or adaptive"));
}

std::string_view ScheduleKindName(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kFixed:
      return "fm";
    case ScheduleKind::kIncremental:
      return "im";
    case ScheduleKind::kIncrementalDecremental:
      return "imdc";
  }
  return "?";
}

std::string_view GrowthName(Growth growth) {
  switch (growth) {
    case Growth::kLinear:
      return "linear";
    case Growth::kSqrt:
      return "sqrt";
    case Growth::kSquare:
      return "square";
    case Growth::kSquareSqrt:
      return "square_sqrt";
    case Growth::kAdaptive:
      return "adaptive";
  }
  return "?";
}

}  // namespace snapfill
