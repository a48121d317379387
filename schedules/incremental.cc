// Memory growth of IM and IMDC (IMDC paper eq. 1, 3, 8, 9): the growth
// curves, the per-layer budgets of a plan, and the adaptive redistribution
// that the engine applies at run time from measured retention ratios.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "schedules/schedule_internal.h"
#include "snapfill/schedule.h"
#include "snapfill/status.h"

namespace snapfill {
namespace schedule_internal {
namespace {

using U128 = unsigned __int128;

// ⌊√x⌋, exact: the floating-point estimate is off by at most a few units for
// x < 2^96, and the loops correct it.
uint64_t Isqrt(U128 x) {
  uint64_t r = static_cast<uint64_t>(std::sqrt(static_cast<long double>(x)));
  while (r > 0 && static_cast<U128>(r) * r > x) --r;
  while (static_cast<U128>(r + 1) * (r + 1) <= x) ++r;
  return r;
}

}  // namespace

int64_t GrowthSize(Growth curve, int64_t first_memory, int64_t max_memory, int64_t step,
                   int64_t num_steps) {
  SNAPFILL_DCHECK(first_memory <= max_memory && 0 <= step && step < num_steps);
  if (step >= num_steps - 1) return max_memory;
  const U128 delta = static_cast<U128>(max_memory - first_memory);
  const U128 i = static_cast<U128>(step);
  const U128 d = static_cast<U128>(num_steps - 1);
  U128 grow = 0;
  switch (curve) {
    case Growth::kSqrt:
      // ⌊Δ·√(i/d)⌋ = ⌊√(Δ²·i/d)⌋ = isqrt(⌊Δ²·i/d⌋).
      grow = Isqrt(delta * delta * i / d);
      break;
    case Growth::kSquare:
      grow = delta * i * i / (d * d);
      break;
    default:  // kLinear, and the linear base of kAdaptive.
      grow = delta * i / d;
      break;
  }
  return first_memory + static_cast<int64_t>(grow);
}

Growth LayerCurve(Growth growth, int64_t layer, int64_t num_layers) {
  switch (growth) {
    case Growth::kSqrt:
    case Growth::kSquare:
      return growth;
    case Growth::kSquareSqrt:
      // The paper's Appendix A.1 pairs square (low layers) with sqrt (high
      // layers) so that their sum integrates to the linear total; the middle
      // layer of an odd count takes linear to keep that balance.
      if (2 * layer + 1 < num_layers) return Growth::kSquare;
      if (2 * layer + 1 > num_layers) return Growth::kSqrt;
      return Growth::kLinear;
    default:
      return Growth::kLinear;
  }
}

std::vector<int64_t> Budgets(ScheduleKind kind, Growth growth, int64_t num_steps,
                             int64_t first_memory, int64_t max_memory, int64_t num_layers) {
  std::vector<int64_t> budgets(num_steps * num_layers, max_memory);
  if (kind == ScheduleKind::kFixed) return budgets;
  for (int64_t layer = 0; layer < num_layers; ++layer) {
    const Growth curve = LayerCurve(growth, layer, num_layers);
    // Layers on the same curve have the same sizes; copy instead of recomputing.
    int64_t same = -1;
    for (int64_t prev = 0; prev < layer && same < 0; ++prev) {
      if (LayerCurve(growth, prev, num_layers) == curve) same = prev;
    }
    for (int64_t i = 0; i < num_steps; ++i) {
      budgets[i * num_layers + layer] =
          same >= 0 ? budgets[i * num_layers + same]
                    : GrowthSize(curve, first_memory, max_memory, i, num_steps);
    }
  }
  return budgets;
}

}  // namespace schedule_internal

absl::StatusOr<std::vector<int64_t>> AdaptiveBudgets(int64_t linear_budget,
                                                     std::span<const double> retention,
                                                     int64_t window, int64_t max_per_layer) {
  const int64_t n = static_cast<int64_t>(retention.size());
  if (n == 0) return absl::InvalidArgumentError("adaptive budgets: no layers (retention is empty)");
  if (linear_budget < window) {
    return absl::InvalidArgumentError(absl::StrCat("adaptive budgets: the linear budget ",
                                                   linear_budget, " is below the window ", window));
  }
  const int64_t hi = max_per_layer > 0 ? max_per_layer : std::numeric_limits<int64_t>::max() / 4;
  if (hi < linear_budget) {
    return absl::InvalidArgumentError(
        absl::StrCat("adaptive budgets: the per-layer cap ", max_per_layer,
                     " is below the linear budget ", linear_budget,
                     ", so the layers cannot hold the linear total"));
  }
  double max_p = 0;
  for (int64_t j = 0; j < n; ++j) {
    const double p = retention[j];
    if (!std::isfinite(p) || p < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "adaptive budgets: retention ratio of layer ", j, " is ", p, ", expected >= 0"));
    }
    max_p = std::max(max_p, p);
  }
  std::vector<int64_t> out(n, linear_budget);
  if (max_p <= 0) return out;  // nothing measured yet: the linear schedule
  // Only the proportions matter; scaling by the largest keeps the sums finite.
  std::vector<double> ratio(n);
  double sum_p = 0;
  for (int64_t j = 0; j < n; ++j) sum_p += (ratio[j] = retention[j] / max_p);

  const int64_t lo = window;
  const double total = static_cast<double>(linear_budget) * static_cast<double>(n);
  const int64_t total_int = linear_budget * n;
  // Continuous allocation t_j = clamp(λ·p_j, lo, hi) with Σ t_j = N·b: the
  // paper's p_j/Σp·N·b when no bound binds, otherwise the surplus of clamped
  // layers is shared by the others in the same proportions.
  auto allocated = [&](double lambda) {
    double s = 0;
    for (int64_t j = 0; j < n; ++j) {
      s += std::clamp(lambda * ratio[j], static_cast<double>(lo), static_cast<double>(hi));
    }
    return s;
  };
  std::vector<double> target(n);
  double at_infinity = 0;  // layers with p > 0 at hi, the others at lo
  for (int64_t j = 0; j < n; ++j) at_infinity += static_cast<double>(ratio[j] > 0 ? hi : lo);
  if (at_infinity < total) {
    // Only when the cap binds for every layer with p > 0: fill the p = 0
    // layers evenly with the rest (N·hi >= N·b keeps them within the cap).
    int64_t zeros = 0;
    for (int64_t j = 0; j < n; ++j) zeros += ratio[j] > 0 ? 0 : 1;
    const double each = (total - (at_infinity - static_cast<double>(zeros * lo))) / zeros;
    for (int64_t j = 0; j < n; ++j) target[j] = ratio[j] > 0 ? hi : each;
  } else {
    double lambda_lo = 0;
    double lambda_hi = total / sum_p;
    for (int iter = 0; iter < 2100 && allocated(lambda_hi) < total; ++iter) lambda_hi *= 2;
    for (int iter = 0; iter < 200 && lambda_hi - lambda_lo > lambda_hi * 1e-16; ++iter) {
      const double mid = 0.5 * (lambda_lo + lambda_hi);
      (allocated(mid) < total ? lambda_lo : lambda_hi) = mid;
    }
    for (int64_t j = 0; j < n; ++j) {
      target[j] = std::clamp(lambda_hi * ratio[j], static_cast<double>(lo),
                             static_cast<double>(hi));
    }
  }
  // Largest remainders: floor, then hand the missing units to the layers
  // furthest below their targets (or take surplus from those furthest above),
  // never leaving [lo, hi]. Ties go to the lower layer.
  int64_t sum = 0;
  for (int64_t j = 0; j < n; ++j) {
    out[j] = std::clamp(static_cast<int64_t>(std::floor(target[j])), lo, hi);
    sum += out[j];
  }
  while (sum != total_int) {
    const bool add = sum < total_int;
    int64_t best = -1;
    double best_gap = 0;
    for (int64_t j = 0; j < n; ++j) {
      if (add ? out[j] >= hi : out[j] <= lo) continue;
      const double gap = add ? target[j] - out[j] : out[j] - target[j];
      if (best < 0 || gap > best_gap) {
        best = j;
        best_gap = gap;
      }
    }
    SNAPFILL_CHECK(best >= 0) << "adaptive budgets: no layer can take the remainder";
    out[best] += add ? 1 : -1;
    sum += add ? 1 : -1;
  }
  return out;
}

double RetentionRatio(std::span<const int64_t> prev_kept, std::span<const int64_t> new_kept) {
  if (new_kept.empty()) return 0.0;
  SNAPFILL_DCHECK(std::is_sorted(prev_kept.begin(), prev_kept.end()));
  SNAPFILL_DCHECK(std::is_sorted(new_kept.begin(), new_kept.end()));
  int64_t common = 0;
  size_t a = 0;
  size_t b = 0;
  while (a < prev_kept.size() && b < new_kept.size()) {
    if (prev_kept[a] < new_kept[b]) {
      ++a;
    } else if (new_kept[b] < prev_kept[a]) {
      ++b;
    } else {
      ++common;
      ++a;
      ++b;
    }
  }
  return static_cast<double>(common) / static_cast<double>(new_kept.size());
}

}  // namespace snapfill
