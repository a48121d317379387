#include "tests/testing/gate_data.h"

#include <cmath>
#include <random>

#include "gtest/gtest.h"
#include "kernels/ref/ops_ref.h"

namespace snapfill::testing {

Backend::GateScoring GateData::Op(const float* params_at, const float* keys_at, float* y_at) const {
  return {.num_heads = heads,
          .head_dim = d,
          .hidden = hidden,
          .n = n,
          .params = params_at,
          .params_stride = params_stride,
          .keys = keys_at,
          .keys_head_stride = head_stride,
          .key_stride = key_stride,
          .y = y_at,
          .y_stride = y_stride};
}

GateData MakeGateData(int64_t heads, int64_t d, int64_t hidden, int64_t n, uint32_t seed) {
  GateData g;
  g.heads = heads;
  g.d = d;
  g.hidden = hidden;
  g.n = n;
  const int64_t pf = Backend::GateParamFloats(d, hidden);
  g.params_stride = pf + 3;
  g.key_stride = d + 2;
  g.head_stride = n * g.key_stride + 5;
  g.y_stride = n + 4;
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  g.params.resize(heads * g.params_stride);
  g.keys.resize(heads * g.head_stride);
  for (float& x : g.params) x = dist(rng);
  for (int64_t h = 0; h < heads; ++h) {  // inverse deviations are positive
    for (int64_t t = 0; t < d; ++t) g.params[h * g.params_stride + d + t] = 0.5f + std::fabs(dist(rng));
  }
  for (float& x : g.keys) x = dist(rng);
  g.want.assign(heads * g.y_stride, -9.0f);
  g.bound.assign(g.want.size(), 0.0);
  for (int64_t h = 0; h < heads; ++h) {
    // mean, inv_std, w1 [hidden][d], b1, w2, b2
    const float* p = g.params.data() + h * g.params_stride;
    const float *inv = p + d, *w1 = p + 2 * d, *b1 = w1 + hidden * d, *w2 = b1 + hidden;
    ref::GateForward(p, inv, w1, b1, w2, p[pf - 1], d, hidden, g.keys.data() + h * g.head_stride, g.key_stride, n,
                     g.want.data() + h * g.y_stride);
    for (int64_t i = 0; i < n; ++i) {
      const float* k = g.keys.data() + h * g.head_stride + i * g.key_stride;
      double m = std::fabs(p[pf - 1]);
      for (int64_t j = 0; j < hidden; ++j) {
        double z = std::fabs(b1[j]);
        for (int64_t t = 0; t < d; ++t) z += std::fabs(w1[j * d + t] * (k[t] - p[t]) * inv[t]);
        m += std::fabs(w2[j]) * z;
      }
      g.bound[h * g.y_stride + i] = 4e-6 * static_cast<double>(d + hidden) * m;
    }
  }
  return g;
}

void ExpectGateScores(const GateData& g, const std::vector<float>& got, const char* what) {
  ASSERT_EQ(got.size(), g.want.size()) << what;
  for (int64_t h = 0; h < g.heads; ++h) {
    for (int64_t i = 0; i < g.y_stride; ++i) {
      const int64_t at = h * g.y_stride + i;
      if (i >= g.n) {
        ASSERT_EQ(got[at], -9.0f) << what << ": wrote past the keys, head " << h << " row " << i;
      } else {
        ASSERT_NEAR(got[at], g.want[at], g.bound[at]) << what << ", " << g.heads << " heads, d " << g.d << ", hidden "
                                                      << g.hidden << ", n " << g.n << ": head " << h << " key " << i;
      }
    }
  }
}

}  // namespace snapfill::testing
