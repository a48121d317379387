// Internals of the size-schedule planners, shared by the files of schedules/
// and nothing else. Public API: include/snapfill/schedule.h.
#ifndef SNAPFILL_SCHEDULES_SCHEDULE_INTERNAL_H_
#define SNAPFILL_SCHEDULES_SCHEDULE_INTERNAL_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "snapfill/schedule.h"

namespace snapfill::schedule_internal {

// ⌊a / b⌋ for b > 0 and any sign of a (C++ division truncates toward zero).
inline int64_t FloorDiv(int64_t a, int64_t b) {
  const int64_t q = a / b;
  return (a % b != 0 && a < 0) ? q - 1 : q;
}

// ⌈a / b⌉ for a >= 0, b > 0.
inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// fixed.cc: FM/IM chunk sizes: `chunk` each, the last one the remainder; a
// remainder at or below `window` is merged into the chunk before it.
std::vector<int64_t> FixedChunks(int64_t total_tokens, int64_t chunk, int64_t window);

// incremental.cc: m0 + ⌊(m_max − m0)·f(i/(n−1))⌋ for curve kLinear, kSqrt or
// kSquare, computed exactly in integers; m_max at i = n−1 (and for n = 1).
int64_t GrowthSize(Growth curve, int64_t first_memory, int64_t max_memory, int64_t step,
                   int64_t num_steps);

// incremental.cc: the curve that layer `layer` of `num_layers` follows under
// `growth` (square-sqrt: square below the middle, sqrt above, linear at the
// middle layer of an odd count; adaptive: linear).
Growth LayerCurve(Growth growth, int64_t layer, int64_t num_layers);

// incremental.cc: budgets for every step and layer, row-major
// [num_steps][num_layers]; FM gives m_max everywhere.
std::vector<int64_t> Budgets(ScheduleKind kind, Growth growth, int64_t num_steps,
                             int64_t first_memory, int64_t max_memory, int64_t num_layers);

// incremental_decremental.cc: IMDC chunk sizes for n = step_memory.size()
// steps, where step_memory[i] = M_i is the sum over layers of the budgets of
// step i. Values may be at or below the window (or negative) for plans that
// cannot work; the caller checks. `tail_extra` receives the number of final
// chunks that carry one token beyond the constant attention length (the
// fallback described in schedule.h; 0 almost always).
std::vector<int64_t> ImdcChunks(int64_t total_tokens, std::span<const int64_t> step_memory,
                                int64_t num_layers, int64_t sink_tokens, int64_t window,
                                int64_t* tail_extra);

// plan.cc: chunks and budgets of a validated configuration, before the
// feasibility checks.
struct Core {
  int64_t first_memory = 0;     // m0 actually used
  std::vector<int64_t> chunks;  // [n]
  std::vector<int64_t> budgets; // [n][num_layers]
  int64_t tail_extra = 0;       // see ImdcChunks
  int64_t bad_step = -1;        // first step whose chunk cannot work, -1 if none
};
Core ComputeCore(const ScheduleConfig& config);

// incremental_decremental.cc: the refusal message for an IMDC plan whose
// step `core.bad_step` cannot work, with a --chunk (and, when one exists, a
// --memory) that works, found by bisection over ComputeCore.
std::string ImdcRefusal(const ScheduleConfig& config, const Core& core);

}  // namespace snapfill::schedule_internal

#endif  // SNAPFILL_SCHEDULES_SCHEDULE_INTERNAL_H_
