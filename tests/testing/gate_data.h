// Test data for Backend::GateScores (the CPU and CUDA backends' tests):
// random gates packed as the op reads them, keys, and the twin's scores with
// the bound a backend's f32 arithmetic must stay within.
#ifndef SNAPFILL_TESTS_TESTING_GATE_DATA_H_
#define SNAPFILL_TESTS_TESTING_GATE_DATA_H_

#include <cstdint>
#include <vector>

#include "snapfill/backend.h"

namespace snapfill::testing {

// `heads` gates of head_dim d and `hidden` units over n keys each, with
// strides wider than the rows: parameters N(0, 1) (inverse deviations
// 0.5 + |N(0, 1)|), keys N(0, 1); want = ref::GateForward's scores (in
// double), -9 past the n keys of each head's row; bound = f32 rounding of
// the terms' magnitudes (4e-6 × (d + hidden) × Σ|terms|): a misread
// parameter or key is off by the order of the terms themselves.
struct GateData {
  int64_t heads = 0, d = 0, hidden = 0, n = 0;
  int64_t params_stride = 0, key_stride = 0, head_stride = 0, y_stride = 0;
  std::vector<float> params, keys, want;
  std::vector<double> bound;
  // The op over these shapes, its operands where the caller has them.
  Backend::GateScoring Op(const float* params_at, const float* keys_at, float* y_at) const;
};
GateData MakeGateData(int64_t heads, int64_t d, int64_t hidden, int64_t n, uint32_t seed);

// Expects got (a whole y, y_stride apart) within the bound of want, and
// untouched (-9) past each head's n scores; `what` names the backend.
void ExpectGateScores(const GateData& g, const std::vector<float>& got, const char* what);

}  // namespace snapfill::testing

#endif  // SNAPFILL_TESTS_TESTING_GATE_DATA_H_
