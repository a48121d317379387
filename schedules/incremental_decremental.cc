// IMDC (IMDC paper §3.4, DESIGN §5): chunks that shrink as the memory grows,
// so that every step after the first attends over the same number of keys.
#include <cstdint>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "schedules/schedule_internal.h"
#include "snapfill/schedule.h"

namespace snapfill::schedule_internal {

// Works in "layer units" (sizes times N) so that the mean memory over layers,
// M_i / N, never has to be rounded:
//   c_0 = ⌊L/n⌋,  A_N = ⌊(N·(L − c_0) + Σ_{i<n−1} M_i) / (n−1)⌋  (= N·(c̄ + m̂)),
//   c_i = ⌊(A_N − M_{i−1}) / N⌋  for i > 0.
// With equal budgets on every layer M = N·m, so c_i = ⌊A_N/N⌋ − m_{i−1} and
// c_i + m_{i−1} is exactly constant. The floors leave E ∈ [0, n−1) tokens
// (E ≥ 0 because every floor rounds down); schedule.h describes where they go.
std::vector<int64_t> ImdcChunks(int64_t total_tokens, std::span<const int64_t> step_memory,
                                int64_t num_layers, int64_t sink_tokens, int64_t window,
                                int64_t* tail_extra) {
  *tail_extra = 0;
  const int64_t n = static_cast<int64_t>(step_memory.size());
  const int64_t big_n = num_layers;
  if (n == 1) return {total_tokens};
  std::vector<int64_t> chunks(n);
  chunks[0] = total_tokens / n;
  const int64_t mem_sum = std::accumulate(step_memory.begin(), step_memory.end() - 1, int64_t{0});
  const int64_t a_n = (big_n * (total_tokens - chunks[0]) + mem_sum) / (n - 1);
  int64_t used = chunks[0];
  for (int64_t i = 1; i < n; ++i) {
    chunks[i] = FloorDiv(a_n - step_memory[i - 1], big_n);
    used += chunks[i];
  }
  const int64_t extra = total_tokens - used;
  // The largest c_0 that keeps step 0's attention (c_0 keys) within step 1's
  // (s + m_0 + c_1, with the mean m_0 floored): step 0 never becomes the peak.
  auto cap0 = [&](int64_t shift) {
    return sink_tokens + chunks[1] + shift + FloorDiv(step_memory[0], big_n);
  };
  auto first_ok = [&](int64_t c0) { return c0 > window && c0 >= sink_tokens + window; };
  // 1) c_0 absorbs the remainder: attention length A for every later step.
  if (chunks[0] + extra <= cap0(0)) {
    chunks[0] += extra;
    return chunks;
  }
  // 2) Every later chunk takes one token more (attention A + 1) and c_0 gives
  //    back what that overshoots.
  const int64_t c0_shifted = chunks[0] + extra - (n - 1);
  if (first_ok(c0_shifted) && c0_shifted <= cap0(1)) {
    chunks[0] = c0_shifted;
    for (int64_t i = 1; i < n; ++i) chunks[i] += 1;
    return chunks;
  }
  // 3) Tiny chunks (n² ≈ L): c_0 takes what fits and the last chunks carry one
  //    extra token each, so no step exceeds A + 1.
  const int64_t take = std::max<int64_t>(0, std::min(extra, cap0(0) - chunks[0]));
  chunks[0] += take;
  int64_t rest = extra - take;
  *tail_extra = std::min(rest, n - 1);
  for (int64_t i = n - *tail_extra; i < n; ++i) chunks[i] += 1;
  chunks[n - 1] += rest - *tail_extra;
  return chunks;
}

namespace {

bool Feasible(const ScheduleConfig& config) { return ComputeCore(config).bad_step < 0; }

}  // namespace

std::string ImdcRefusal(const ScheduleConfig& config, const Core& core) {
  const int64_t n = static_cast<int64_t>(core.chunks.size());
  const int64_t i = core.bad_step;
  const int64_t big_n = config.num_layers;
  double mean_hat = 0;
  for (int64_t s = 0; s + 1 < n; ++s) {
    for (int64_t l = 0; l < big_n; ++l) mean_hat += static_cast<double>(core.budgets[s * big_n + l]);
  }
  mean_hat = n > 1 ? mean_hat / static_cast<double>((n - 1) * big_n) : config.memory;
  std::string msg = absl::StrFormat(
      "IMDC with --chunk=%d --memory=%d (--growth=%s, first memory %d, %d chunks of %d on "
      "average): ",
      config.chunk, config.memory, GrowthName(config.growth), core.first_memory, n,
      config.total_tokens / n);
  const int64_t c = core.chunks[i];
  if (i == 0 && c > config.window) {
    absl::StrAppendFormat(&msg,
                          "the first chunk of %d tokens cannot hold --sink_tokens=%d and "
                          "--window=%d",
                          c, config.sink_tokens, config.window);
  } else {
    absl::StrAppendFormat(&msg,
                          "chunk %d of %d would be %d tokens, at or below --window=%d (the "
                          "chunks shrink by about m_max - m̂ = %.0f so that memory + chunk "
                          "stays at %.0f)",
                          i, n, c, config.window, static_cast<double>(config.memory) - mean_hat,
                          static_cast<double>(config.total_tokens) / n + mean_hat);
  }
  // Smallest working --chunk by bisection: `bad` never works, `good` always
  // does. One chunk (--chunk = L) works unless the window and sinks do not fit
  // in the input, which validation has already excluded.
  ScheduleConfig probe = config;
  int64_t bad = config.chunk;
  int64_t good = config.total_tokens;
  probe.chunk = good;
  std::string suggestions;
  if (good > bad && Feasible(probe)) {
    while (good - bad > 1) {
      const int64_t mid = bad + (good - bad) / 2;
      probe.chunk = mid;
      (Feasible(probe) ? good : bad) = mid;
    }
    absl::StrAppendFormat(&suggestions, "use --chunk >= %d", good);
  }
  // Largest working --memory with the given chunk, by bisection as well.
  // Every probe plans all n·N budgets again, so it is skipped for plans of
  // more than 2^22 budgets: a dozen probes of up to 2^26 budgets took over
  // ten seconds to refuse a tiny --chunk on a long input (found by fuzzing).
  probe = config;
  int64_t mem_good = std::max(config.window, config.first_memory);
  int64_t mem_bad = config.memory;
  probe.memory = mem_good;
  constexpr int64_t kMaxProbeBudgets = int64_t{1} << 22;
  if (n * big_n <= kMaxProbeBudgets && mem_good < mem_bad && Feasible(probe)) {
    while (mem_bad - mem_good > 1) {
      const int64_t mid = mem_good + (mem_bad - mem_good) / 2;
      probe.memory = mid;
      (Feasible(probe) ? mem_good : mem_bad) = mid;
    }
    absl::StrAppendFormat(&suggestions, "%s--memory <= %d with --chunk=%d",
                          suggestions.empty() ? "use " : ", or ", mem_good, config.chunk);
  }
  if (suggestions.empty()) suggestions = "use a larger --chunk or a smaller --memory";
  absl::StrAppend(&msg, "; ", suggestions);
  return msg;
}

}  // namespace snapfill::schedule_internal
