// Token sampling: greedy at temperature 0, otherwise top-k, then top-p
// (nucleus), then a draw from the temperature softmax. Deterministic for a
// given seed (std::mt19937_64 with our own uniform conversion, since the
// standard distributions differ between library implementations).
#ifndef SNAPFILL_ENGINE_SAMPLER_H_
#define SNAPFILL_ENGINE_SAMPLER_H_

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace snapfill {

struct SamplingParams {
  float temperature = 0.0f;  // <= 0: greedy (argmax)
  int top_k = 40;            // <= 0: no top-k cut
  float top_p = 0.95f;       // >= 1: no nucleus cut
  uint64_t seed = 0;
};

// Returns InvalidArgument naming the bad field.
absl::Status ValidateSamplingParams(const SamplingParams& p);

// Returns the index of the largest value (the first one on ties).
int32_t Argmax(const float* logits, int64_t n);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}
  // Returns the next token id from logits[0..vocab).
  int32_t Sample(const float* logits, int64_t vocab);

 private:
  double Uniform();  // in [0, 1)
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> candidates_;
};

}  // namespace snapfill

#endif  // SNAPFILL_ENGINE_SAMPLER_H_
