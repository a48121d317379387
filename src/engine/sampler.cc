#include "src/engine/sampler.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace snapfill {

absl::Status ValidateSamplingParams(const SamplingParams& p) {
  if (!std::isfinite(p.temperature) || p.temperature < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--temp=", p.temperature, " must be >= 0"));
  }
  if (!(p.top_p > 0.0f) || p.top_p > 1.0f) {
    return absl::InvalidArgumentError(absl::StrCat("--top_p=", p.top_p, " must be in (0, 1]"));
  }
  if (p.top_k < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--top_k=", p.top_k, " must be >= 0"));
  }
  return absl::OkStatus();
}

int32_t Argmax(const float* logits, int64_t n) {
  if (n <= 0) return 0;
  // The largest value, 16 running maxima at a time (the compiler vectorizes
  // this; a scan that compares against logits[best] does not, and took about
  // 20 µs of each decode step over 49,152 logits), then the first index that
  // holds it. Every lane starts at logits[0] and takes a value only if it is
  // larger, so a NaN never wins unless it is logits[0], when nothing can be
  // larger: the same index as the plain scan.
  constexpr int kLanes = 16;
  float lane[kLanes];
  for (float& l : lane) l = logits[0];
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) lane[l] = logits[i + l] > lane[l] ? logits[i + l] : lane[l];
  }
  float best = logits[0];
  for (float l : lane) best = l > best ? l : best;
  for (; i < n; ++i) best = logits[i] > best ? logits[i] : best;
  for (int64_t j = 0; j < n; ++j) {
    if (logits[j] == best) return static_cast<int32_t>(j);
  }
  return 0;  // logits[0] is NaN
}

double Sampler::Uniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }

int32_t Sampler::Sample(const float* logits, int64_t vocab) {
  if (params_.temperature <= 0.0f) return Argmax(logits, vocab);
  candidates_.clear();
  candidates_.reserve(vocab);
  for (int64_t i = 0; i < vocab; ++i) candidates_.emplace_back(logits[i], static_cast<int32_t>(i));
  // Order: higher logit first, then lower id, so results do not depend on
  // the sort's stability.
  auto better = [](const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  };
  int64_t keep = vocab;
  if (params_.top_k > 0 && params_.top_k < vocab) {
    keep = params_.top_k;
    std::partial_sort(candidates_.begin(), candidates_.begin() + keep, candidates_.end(), better);
  } else {
    std::sort(candidates_.begin(), candidates_.end(), better);
  }
  candidates_.resize(keep);
  const double max_logit = candidates_[0].first;
  std::vector<double> probs(keep);
  double total = 0;
  for (int64_t i = 0; i < keep; ++i) {
    probs[i] = std::exp((candidates_[i].first - max_logit) / params_.temperature);
    total += probs[i];
  }
  if (params_.top_p < 1.0f) {
    double cum = 0;
    int64_t cut = keep;
    for (int64_t i = 0; i < keep; ++i) {
      cum += probs[i] / total;
      if (cum >= params_.top_p) {
        cut = i + 1;
        break;
      }
    }
    keep = cut;
    total = 0;
    for (int64_t i = 0; i < keep; ++i) total += probs[i];
  }
  const double r = Uniform() * total;
  double cum = 0;
  for (int64_t i = 0; i < keep; ++i) {
    cum += probs[i];
    if (r < cum) return candidates_[i].second;
  }
  return candidates_[keep - 1].second;
}

}  // namespace snapfill
