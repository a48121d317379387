// Size schedules of the chunked prefill (DESIGN.md §5, IMDC paper §3).
//
// This module owns the policy that decides how long each chunk is and how
// many KV entries each layer's memory keeps after each chunk. It is pure: a
// configuration goes in, a plan comes out, and nothing here knows about
// models, tensors or devices. The engine walks the plan step by step; the
// command line prints it for --dry_run; tests assert on it.
//
// Kinds:
//   FM   fixed memory:      c_i = c, m_i = m_max.
//   IM   incremental memory: c_i = c, m_i grows from m0 to m_max (growth).
//   IMDC incremental memory with decremental chunk: m_i grows as in IM and
//        c_i = c̄ + m̂ − m_{i−1} shrinks so that the attention length
//        m_{i−1} + c_i stays constant.
//
// Rounding (all sizes are integers):
//   - Chunks of FM/IM are c, the last one the remainder; a remainder at or
//     below the window is merged into the chunk before it.
//   - Growth curves are floored: m_i = m0 + ⌊(m_max − m0)·f(i/(n−1))⌋, exact in
//     integer arithmetic, so m_{n−1} = m_max and sizes never decrease.
//   - IMDC: n = ⌈L/c⌉, c_0 = ⌊L/n⌋, and A = ⌊c̄ + m̂⌋ is an integer, so that
//     c_i + m_{i−1} = A exactly for 0 < i < n−1 whenever every layer has the
//     same budget (with square-sqrt the per-layer mean is fractional and the
//     sum varies by less than one token). The rounding remainder (fewer than
//     n tokens) goes to c_0 while step 0 stays within the attention length A;
//     otherwise every chunk after the first takes one token more (A + 1) and
//     c_0 gives the surplus back. Only when neither fits (n² of the order of L,
//     i.e. tiny chunks) do the last few chunks carry one extra token each, and
//     the plan says so in a warning. This keeps the peak attention length at
//     A or A + 1; sending the whole remainder to the last chunk, as a literal
//     reading of DESIGN §5 would, lets it grow by up to n − 2 tokens (975 at
//     1M tokens and c = 1024), more than FM's m_max + c.
//
// Plans that cannot work are refused with InvalidArgument before any work
// starts, naming the flags and a value that works: empty input, memory below
// the window, a chunk at or below the window. An input no longer than the
// window has nothing to compress: it is planned as one chunk kept whole (a
// warning says so; first_memory is then left as given). Positions beyond the
// model's trained context are a warning, not an error.
#ifndef SNAPFILL_SCHEDULE_H_
#define SNAPFILL_SCHEDULE_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace snapfill {

enum class ScheduleKind {
  kFixed,                   // FM, --schedule=fm
  kIncremental,             // IM, --schedule=im
  kIncrementalDecremental,  // IMDC, --schedule=imdc
};

// How IM/IMDC memory grows from m0 to m_max; ignored by FM.
enum class Growth {
  kLinear,      // m0 + Δ·i/(n−1)
  kSqrt,        // m0 + Δ·√(i/(n−1))
  kSquare,      // m0 + Δ·(i/(n−1))²
  kSquareSqrt,  // square in the lower half of the layers, sqrt in the upper
                // half; with an odd layer count the middle layer is linear.
  kAdaptive,    // per layer, from the measured retention ratios; the plan
                // holds the linear budgets and the engine redistributes them
                // each step with AdaptiveBudgets().
};

// What the planner needs; every field maps to one command-line flag.
struct ScheduleConfig {
  int64_t total_tokens = 0;  // L, tokens in the input
  int64_t chunk = 1024;      // c (--chunk): FM/IM chunk size, IMDC average chunk target
  int64_t memory = 1024;     // m_max (--memory): final memory per layer and KV head
  int64_t first_memory = 0;  // m0 (--first_memory): 0 = max(window, ⌊memory / n⌋)
  int64_t window = 32;       // w (--window): SnapKV observation queries
  int64_t num_layers = 1;    // N
  ScheduleKind kind = ScheduleKind::kFixed;
  Growth growth = Growth::kLinear;
  int64_t sink_tokens = 0;   // s (--sink_tokens): first tokens pinned outside the budget
  int64_t max_position = 0;  // the model's trained context (positions); 0 = unknown
  // (--keep_last_chunk) The last step keeps its chunk whole beside the
  // memory: budget m_{n−1} + c_{n−1}, so nothing of the input's end is
  // evicted (an input of one chunk is kept whole). For a question read
  // after the prefill, which then sees the input's end as a question in the
  // prompt would (DESIGN.md §5). Not with adaptive growth (a warning says
  // so): its budgets are redistributed every step.
  bool keep_last_chunk = false;
};

// One chunk of the loop.
struct ScheduleStep {
  int64_t start_token = 0;   // index of the chunk's first token in the input
  int64_t chunk_tokens = 0;  // c_i
  // [num_layers] m_i^l: the memory budget of layer l after compressing this
  // step (sinks not included). For adaptive growth these are the linear b_i.
  std::vector<int64_t> budget;
  // Keys the step's attention reads (largest over layers): s + kept_{i−1} + c_i,
  // where kept is min(budget, what the input has supplied so far); c_0 at step 0.
  int64_t attention_length = 0;
};

struct SchedulePlan {
  ScheduleConfig config;  // as given, with first_memory resolved to the m0 used
  std::vector<ScheduleStep> steps;
  std::vector<std::string> warnings;  // non-fatal findings, printed by the tools
  bool adaptive = false;  // budgets are linear; call AdaptiveBudgets() for i > 0
  double mean_memory = 0;            // m̂ = mean of budgets of steps 0..n−2 (m_0 if n = 1)
  int64_t peak_attention_length = 0;  // max over steps of attention_length
  int64_t max_chunk_tokens = 0;       // the largest c_i (sizes the activation scratch)
  // Largest number of live KV slots per KV head, summed over layers, at any
  // moment: the memories (compressed or not yet) plus one layer's memory ∪
  // chunk during its compression, sinks included. Multiply by
  // 2·num_kv_heads·head_dim·bytes for bytes. For adaptive growth this is the
  // linear plan's figure (the total over layers is the same; the split is not).
  int64_t peak_kv_slots = 0;
};

// Plans the whole prefill, or says why it cannot work (InvalidArgument, with
// the flag names and a suggestion).
absl::StatusOr<SchedulePlan> PlanSchedule(const ScheduleConfig& config);

// Adaptive growth (DESIGN §5, paper eq. 3): distributes N·linear_budget over
// N = retention.size() layers in proportion to the layers' retention ratios,
// each budget in [window, max_per_layer] (max_per_layer <= 0: no upper
// bound), integers summing to N·linear_budget exactly (largest remainders).
// All-zero ratios (step 1, when nothing was retained yet) give the linear
// budget to every layer. InvalidArgument when a ratio is negative or not
// finite, or when window <= linear_budget <= max_per_layer does not hold.
absl::StatusOr<std::vector<int64_t>> AdaptiveBudgets(int64_t linear_budget,
                                                     std::span<const double> retention,
                                                     int64_t window, int64_t max_per_layer);

// Memory retention ratio (paper eq. 2): |M_{i−1} ∩ M_i| / |M_i| over original
// token positions; both sorted ascending without duplicates. 0 if M_i is empty.
double RetentionRatio(std::span<const int64_t> prev_kept, std::span<const int64_t> new_kept);

// Predicted speed-up of IM over FM (paper eq. 4): r·((m_max + c)/(m̂ + c) − 1) + 1,
// with r the share of time spent in attention.
double PredictedSpeedup(double attention_share, double max_memory, double mean_memory,
                        double chunk);

// A readable table for --dry_run: a header with the resolved configuration,
// one row per step (step, start, chunk, memory mean and min–max over layers,
// attention length), the middle elided when there are more than max_rows steps
// (max_rows <= 0: all), a summary line and the warnings.
std::string FormatPlan(const SchedulePlan& plan, int max_rows = 24);

// Flag values: "fm" | "im" | "imdc" (also "fixed", "incremental",
// "incremental_decremental"); "linear" | "sqrt" | "square" | "square_sqrt"
// (or "square-sqrt") | "adaptive".
absl::StatusOr<ScheduleKind> ParseScheduleKind(std::string_view name);
absl::StatusOr<Growth> ParseGrowth(std::string_view name);
std::string_view ScheduleKindName(ScheduleKind kind);  // "fm", "im", "imdc"
std::string_view GrowthName(Growth growth);            // "linear", ..., "square_sqrt", "adaptive"

}  // namespace snapfill

#endif  // SNAPFILL_SCHEDULE_H_
