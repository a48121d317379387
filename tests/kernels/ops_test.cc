// Tests of the element-wise CPU kernels (RmsNorm, Rope, SwiGlu, pooling,
// TopKIndices, Softmax, Argmax) against their scalar twins in kernels/ref.
//
// Tolerances are derived per element from the operation count (eps = f32
// unit roundoff 2^-23 ≈ 1.19e-7; each f32 operation adds at most eps/2
// relative error, libm/polynomial exp/cos/sin at most ~1-2 ulp):
//   RmsNorm: sum in double (exact to ~1e-16), then mean, +eps, sqrt, 1/x,
//            x·s, ·w: 6 f32 roundings, |err| <= 4·eps·|y|.
//   Rope:    same f32 angle in both; cos/sin 1 ulp each and 2 products + 1
//            add: |err| <= 3·eps·(|x0| + |x1|).
//   SwiGlu:  exp ~2 ulp, 1 + e, divide, multiply: |err| <= 6·eps·|y|
//            (+1e-30 absolute for the flushed exp overflow, g < -87).
//   AvgPool: f32 sum of `kernel` terms: |err| <= kernel·eps·Σ|in|/kernel + eps·|y|.
//   Softmax: x - max rounds by eps/2·|x - max| absolute, i.e. that much
//            relative in exp; exp 2 ulp, f32 sum of n terms (n·eps relative),
//            one scale: |err| <= (n + 4 + |x - max|/2)·eps·p.
#include "kernels/cpu/ops.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/thread_scratch.h"
#include "kernels/ref/ops_ref.h"
#include "src/base/int8_rows.h"

namespace snapfill {
namespace {

constexpr double kEps = std::numeric_limits<float>::epsilon();

std::vector<float> RandomVector(int64_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Expects |actual[i] - expected[i]| <= tol[i] for all i; on failure reports
// the worst index (largest error / tolerance), its values, and the count
// outside tolerance.
::testing::AssertionResult AllWithin(const std::vector<float>& actual,
                                     const std::vector<float>& expected,
                                     const std::vector<double>& tol) {
  if (actual.size() != expected.size() || actual.size() != tol.size()) {
    return ::testing::AssertionFailure() << "size mismatch " << actual.size() << " vs "
                                         << expected.size() << " vs " << tol.size();
  }
  int64_t worst = -1, bad = 0;
  double worst_ratio = 0.0;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double err = std::abs(static_cast<double>(actual[i]) - expected[i]);
    const double ratio = err / tol[i];
    if (!(err <= tol[i])) {
      ++bad;
      if (!(ratio <= worst_ratio)) {
        worst_ratio = ratio;
        worst = static_cast<int64_t>(i);
      }
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << actual.size() << " outside tolerance; worst index " << worst
         << ": expected " << expected[worst] << ", actual " << actual[worst] << ", tolerance "
         << tol[worst];
}

// ---------------------------------------------------------------------------
// RmsNorm

struct NormCase {
  int64_t rows;
  int64_t dim;
  int64_t offset;  // misalignment of x and y in floats
  int64_t pad;     // row stride = dim + pad
};

class RmsNormTest : public ::testing::TestWithParam<NormCase> {};

TEST_P(RmsNormTest, MatchesRef) {
  const NormCase c = GetParam();
  const int64_t stride = c.dim + c.pad;
  const float eps = 1e-5f;
  std::vector<float> xbuf = RandomVector(c.offset + c.rows * stride, -3.0f, 3.0f, 1);
  const std::vector<float> w = RandomVector(c.dim, 0.5f, 1.5f, 2);
  std::vector<float> y_cpu(c.offset + c.rows * stride, 7.0f), y_ref(y_cpu);
  const float* x = xbuf.data() + c.offset;
  cpu::RmsNorm(x, stride, w.data(), y_cpu.data() + c.offset, stride, c.rows, c.dim, eps);
  ref::RmsNorm(x, stride, w.data(), y_ref.data() + c.offset, stride, c.rows, c.dim, eps);
  std::vector<float> got, want;
  std::vector<double> tol;
  for (int64_t r = 0; r < c.rows; ++r) {
    for (int64_t i = 0; i < stride; ++i) {
      const int64_t idx = c.offset + r * stride + i;
      got.push_back(y_cpu[idx]);
      want.push_back(y_ref[idx]);
      // Padding must be untouched (ref leaves it at 7 too).
      tol.push_back(i < c.dim ? 4.0 * kEps * std::abs(y_ref[idx]) + 1e-30 : 0.0);
    }
  }
  EXPECT_TRUE(AllWithin(got, want, tol));
}

TEST_P(RmsNormTest, InPlaceEqualsOutOfPlace) {
  const NormCase c = GetParam();
  const int64_t stride = c.dim + c.pad;
  std::vector<float> x = RandomVector(c.offset + c.rows * stride, -2.0f, 2.0f, 3);
  const std::vector<float> w = RandomVector(c.dim, -1.0f, 1.0f, 4);
  std::vector<float> y(x.size());
  cpu::RmsNorm(x.data() + c.offset, stride, w.data(), y.data() + c.offset, stride, c.rows, c.dim,
               1e-6f);
  cpu::RmsNorm(x.data() + c.offset, stride, w.data(), x.data() + c.offset, stride, c.rows, c.dim,
               1e-6f);
  for (int64_t r = 0; r < c.rows; ++r) {
    for (int64_t i = 0; i < c.dim; ++i) {
      const int64_t idx = c.offset + r * stride + i;
      ASSERT_EQ(x[idx], y[idx]) << "row " << r << " dim " << i;
    }
  }
}

std::string NormName(const ::testing::TestParamInfo<NormCase>& info) {
  const NormCase& c = info.param;
  return "Cpu_rows" + std::to_string(c.rows) + "_dim" + std::to_string(c.dim) + "_off" +
         std::to_string(c.offset) + "_pad" + std::to_string(c.pad);
}

INSTANTIATE_TEST_SUITE_P(Shapes, RmsNormTest,
                         ::testing::Values(NormCase{1, 1, 0, 0}, NormCase{3, 17, 1, 0},
                                           NormCase{17, 111, 0, 3}, NormCase{2, 4097, 1, 5},
                                           NormCase{5, 576, 0, 0},   // SmolLM2-135M
                                           NormCase{3, 4096, 1, 0},  // Llama-3-8B
                                           NormCase{111, 3, 0, 1}),
                         NormName);

// Independent check of the formula: a row of constant c normalizes to
// sign(c)·w / sqrt(1 + eps/c²) exactly up to rounding.
TEST(RmsNormFormula, ConstantRow) {
  const int64_t dim = 100;
  std::vector<float> x(dim, -2.0f), w(dim), y(dim);
  for (int64_t i = 0; i < dim; ++i) w[i] = 0.01f * static_cast<float>(i);
  cpu::RmsNorm(x.data(), dim, w.data(), y.data(), dim, 1, dim, 1e-5f);
  for (int64_t i = 0; i < dim; ++i) {
    const double expected = -static_cast<double>(w[i]) / std::sqrt(1.0 + 1e-5 / 4.0);
    EXPECT_NEAR(y[i], expected, 4.0 * kEps * std::abs(expected) + 1e-30) << "dim " << i;
  }
}

// ---------------------------------------------------------------------------
// Rope

struct RopeCase {
  int64_t num_tokens;
  int64_t num_heads;
  int64_t head_dim;
  int64_t rot_dim;
  int64_t pad;  // token stride = num_heads * head_dim + pad
  bool neox;
  float freq_scale;
};

class RopeTest : public ::testing::TestWithParam<RopeCase> {
 protected:
  // Positions: a few large ones (long context) and consecutive small ones.
  std::vector<int32_t> Positions(int64_t n) const {
    std::vector<int32_t> pos(n);
    for (int64_t t = 0; t < n; ++t)
      pos[t] = t % 3 == 2 ? static_cast<int32_t>(30000 + 7 * t) : static_cast<int32_t>(t);
    return pos;
  }
};

TEST_P(RopeTest, MatchesRef) {
  const RopeCase c = GetParam();
  const int64_t stride = c.num_heads * c.head_dim + c.pad;
  const std::vector<float> x0 = RandomVector(1 + c.num_tokens * stride, -2.0f, 2.0f, 5);
  std::vector<float> x_cpu = x0, x_ref = x0;
  const std::vector<int32_t> pos = Positions(c.num_tokens);
  cpu::Rope(x_cpu.data() + 1, c.num_tokens, c.num_heads, c.head_dim, stride, pos.data(), c.rot_dim,
            10000.0f, c.freq_scale, c.neox);
  ref::Rope(x_ref.data() + 1, c.num_tokens, c.num_heads, c.head_dim, stride, pos.data(), c.rot_dim,
            10000.0f, c.freq_scale, c.neox);
  std::vector<double> tol(x0.size(), 0.0);  // untouched elements must stay exact
  const int64_t half = c.rot_dim / 2;
  for (int64_t t = 0; t < c.num_tokens; ++t) {
    for (int64_t h = 0; h < c.num_heads; ++h) {
      const int64_t base = 1 + t * stride + h * c.head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const int64_t a = base + (c.neox ? i : 2 * i);
        const int64_t b = base + (c.neox ? i + half : 2 * i + 1);
        const double bound = 3.0 * kEps * (std::abs(x0[a]) + std::abs(x0[b]));
        tol[a] = tol[b] = bound;
      }
    }
  }
  EXPECT_TRUE(AllWithin(x_cpu, x_ref, tol));
}

// Independent check against the closed form theta_i = pos · freq_scale ·
// base^(-2i/rot_dim) in double. ggml's f32 recurrence theta_{i+1} =
// theta_i · theta_scale accumulates i roundings plus i times the rounding
// of powf (≈1 ulp): |Δθ_i| <= (2i + 2)·eps·θ_i, and a rotation error Δθ moves
// an output by at most |Δθ|·(|x0| + |x1|).
// The closed form of x0 rotated (in double), and each element's tolerance:
// the f32 recurrence's (2i + 2 + extra) roundings of theta_i, plus the
// rotation's own 4 (extra: 1 where a factor divides the angle).
struct ClosedForm {
  std::vector<float> want;
  std::vector<double> tol;
};
ClosedForm RotateClosedForm(const std::vector<float>& x0, const std::vector<int32_t>& pos, const RopeCase& c,
                            int64_t stride, double base_freq, const float* factors) {
  ClosedForm r{x0, std::vector<double>(x0.size(), 0.0)};
  const int64_t half = c.rot_dim / 2;
  const double extra = factors != nullptr ? 1.0 : 0.0;
  for (int64_t t = 0; t < c.num_tokens; ++t) {
    for (int64_t h = 0; h < c.num_heads; ++h) {
      const int64_t base = t * stride + h * c.head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const double theta = pos[t] * static_cast<double>(c.freq_scale) * std::pow(base_freq, -2.0 * i / c.rot_dim) /
                             (factors != nullptr ? factors[i] : 1.0f);
        const int64_t a = base + (c.neox ? i : 2 * i);
        const int64_t b = base + (c.neox ? i + half : 2 * i + 1);
        const double xa = x0[a], xb = x0[b];
        r.want[a] = static_cast<float>(xa * std::cos(theta) - xb * std::sin(theta));
        r.want[b] = static_cast<float>(xa * std::sin(theta) + xb * std::cos(theta));
        r.tol[a] = r.tol[b] = ((2.0 * i + 2.0 + extra) * kEps * theta + 4.0 * kEps) * (std::abs(xa) + std::abs(xb));
      }
    }
  }
  return r;
}

TEST_P(RopeTest, MatchesClosedForm) {
  const RopeCase c = GetParam();
  const int64_t stride = c.num_heads * c.head_dim + c.pad;
  const std::vector<float> x0 = RandomVector(c.num_tokens * stride, -2.0f, 2.0f, 6);
  std::vector<float> x = x0;
  const std::vector<int32_t> pos = Positions(c.num_tokens);
  const float base_freq = 500000.0f;  // Llama-3's rope_theta
  cpu::Rope(x.data(), c.num_tokens, c.num_heads, c.head_dim, stride, pos.data(), c.rot_dim,
            base_freq, c.freq_scale, c.neox);
  const ClosedForm want = RotateClosedForm(x0, pos, c, stride, base_freq, nullptr);
  EXPECT_TRUE(AllWithin(x, want.want, want.tol));
}

// Llama 3.1's frequency factors (rope_freqs): pair i's angle divided by
// factors[i]. Against the twin and the closed form, and the table of
// angles a thread keeps is rebuilt when only the factors change.
TEST_P(RopeTest, FrequencyFactorsMatchRefAndClosedForm) {
  const RopeCase c = GetParam();
  const int64_t stride = c.num_heads * c.head_dim + c.pad;
  const int64_t half = c.rot_dim / 2;
  // As the converter makes them: 1 for short wavelengths, 8 for long ones,
  // a smooth ramp between.
  std::vector<float> factors(half), other(half);
  for (int64_t i = 0; i < half; ++i) {
    const double r = half > 1 ? static_cast<double>(i) / (half - 1) : 0.0;
    factors[i] = static_cast<float>(r < 0.3 ? 1.0 : r > 0.7 ? 8.0 : 1.0 + 7.0 * (r - 0.3) / 0.4);
    other[i] = 2.0f * factors[i];
  }
  const std::vector<float> x0 = RandomVector(c.num_tokens * stride, -2.0f, 2.0f, 8);
  const std::vector<int32_t> pos = Positions(c.num_tokens);
  // Small positions too, so that the table path runs (positions < 2^16).
  std::vector<int32_t> small(c.num_tokens);
  for (int64_t t = 0; t < c.num_tokens; ++t) small[t] = static_cast<int32_t>(3 * t);
  for (const std::vector<int32_t>* p : {&pos, static_cast<const std::vector<int32_t>*>(&small)}) {
    std::vector<float> x_cpu = x0, x_ref = x0, x_other = x0;
    cpu::Rope(x_other.data(), c.num_tokens, c.num_heads, c.head_dim, stride, p->data(), c.rot_dim, 10000.0f,
              c.freq_scale, c.neox, other.data());
    cpu::Rope(x_cpu.data(), c.num_tokens, c.num_heads, c.head_dim, stride, p->data(), c.rot_dim, 10000.0f,
              c.freq_scale, c.neox, factors.data());
    ref::Rope(x_ref.data(), c.num_tokens, c.num_heads, c.head_dim, stride, p->data(), c.rot_dim, 10000.0f,
              c.freq_scale, c.neox, factors.data());
    const ClosedForm want = RotateClosedForm(x0, *p, c, stride, 10000.0, factors.data());
    // The twin computes the same f32 angles: only the rotation differs.
    std::vector<double> tol_ref(x0.size(), 0.0);
    for (size_t i = 0; i < x0.size(); ++i) tol_ref[i] = want.tol[i] > 0 ? 3.0 * kEps * 4.0 : 0.0;
    EXPECT_TRUE(AllWithin(x_cpu, x_ref, tol_ref));
    EXPECT_TRUE(AllWithin(x_cpu, want.want, want.tol));
    if (c.num_tokens > 1 && c.rot_dim > 2) {
      EXPECT_NE(x_cpu, x_other) << "the factors must change the angles";
    }
  }
}

// Position 0 is the identity; rotations preserve each pair's norm.
TEST_P(RopeTest, IdentityAtZeroAndNormPreserving) {
  const RopeCase c = GetParam();
  const int64_t stride = c.num_heads * c.head_dim + c.pad;
  const std::vector<float> x0 = RandomVector(c.num_tokens * stride, -2.0f, 2.0f, 7);
  std::vector<float> x = x0;
  std::vector<int32_t> zeros(c.num_tokens, 0);
  cpu::Rope(x.data(), c.num_tokens, c.num_heads, c.head_dim, stride, zeros.data(), c.rot_dim,
            10000.0f, c.freq_scale, c.neox);
  ASSERT_EQ(x, x0);
  const std::vector<int32_t> pos = Positions(c.num_tokens);
  cpu::Rope(x.data(), c.num_tokens, c.num_heads, c.head_dim, stride, pos.data(), c.rot_dim,
            10000.0f, c.freq_scale, c.neox);
  const int64_t half = c.rot_dim / 2;
  for (int64_t t = 0; t < c.num_tokens; ++t) {
    for (int64_t h = 0; h < c.num_heads; ++h) {
      const int64_t base = t * stride + h * c.head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const int64_t a = base + (c.neox ? i : 2 * i);
        const int64_t b = base + (c.neox ? i + half : 2 * i + 1);
        const double before = std::hypot(x0[a], x0[b]);
        const double after = std::hypot(x[a], x[b]);
        // |err| <= 3·eps·(|x0|+|x1|) per component (see MatchesRef).
        ASSERT_NEAR(after, before, 6.0 * kEps * (std::abs(x0[a]) + std::abs(x0[b])))
            << "token " << t << " head " << h << " pair " << i;
      }
    }
  }
}

std::string RopeName(const ::testing::TestParamInfo<RopeCase>& info) {
  const RopeCase& c = info.param;
  return std::string(c.neox ? "Cpu_neox" : "Cpu_norm") + "_tokens" + std::to_string(c.num_tokens) +
         "_heads" + std::to_string(c.num_heads) + "_hd" + std::to_string(c.head_dim) + "_rot" +
         std::to_string(c.rot_dim) + "_pad" + std::to_string(c.pad) + "_fs" +
         std::to_string(static_cast<int>(c.freq_scale * 100));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, RopeTest,
    ::testing::Values(RopeCase{1, 1, 2, 2, 0, false, 1.0f}, RopeCase{3, 3, 18, 18, 1, true, 1.0f},
                      RopeCase{17, 9, 64, 64, 0, false, 1.0f},  // SmolLM2 Q
                      RopeCase{17, 3, 64, 64, 3, true, 1.0f},
                      RopeCase{5, 32, 128, 128, 0, false, 0.25f},  // Llama-3-8B Q, scaled
                      RopeCase{111, 2, 80, 32, 5, false, 1.0f},    // partial rotation
                      RopeCase{7, 2, 96, 64, 0, true, 0.5f}),
    RopeName);

// ---------------------------------------------------------------------------
// SwiGlu

class SwiGluTest : public ::testing::TestWithParam<int64_t> {};

TEST_P(SwiGluTest, MatchesRef) {
  const int64_t n = GetParam();
  std::vector<float> gate = RandomVector(n + 1, -12.0f, 12.0f, 8);
  const std::vector<float> up = RandomVector(n + 1, -2.0f, 2.0f, 9);
  // Edge values: zero, the exp flush boundaries, saturation.
  const float edges[] = {0.0f, -0.0f, 86.9f, -86.9f, 87.5f, -87.5f, 100.0f, -100.0f, 1e-8f, -1e-8f};
  for (int64_t i = 0; i < std::min<int64_t>(n, 10); ++i) gate[1 + i * (n / 10 + 1) % n] = edges[i];
  std::vector<float> y_cpu(n + 1), y_ref(n + 1);
  cpu::SwiGlu(gate.data() + 1, up.data() + 1, y_cpu.data() + 1, n);
  ref::SwiGlu(gate.data() + 1, up.data() + 1, y_ref.data() + 1, n);
  std::vector<float> got(y_cpu.begin() + 1, y_cpu.end()), want(y_ref.begin() + 1, y_ref.end());
  std::vector<double> tol(n);
  for (int64_t i = 0; i < n; ++i) tol[i] = 6.0 * kEps * std::abs(want[i]) + 1e-30;
  EXPECT_TRUE(AllWithin(got, want, tol));
}

INSTANTIATE_TEST_SUITE_P(Sizes, SwiGluTest, ::testing::Values(1, 3, 17, 111, 1536, 4097, 100003),
                         [](const ::testing::TestParamInfo<int64_t>& info) {
                           return "Cpu_n" + std::to_string(info.param);
                         });

// GeGLU (Gemma): the f32 tanh form against the twin's double. Near g = 0 the
// output is tiny while the tanh argument's rounding is relative to 1, so the
// bound is relative to |g · up| as well as to the output.
TEST_P(SwiGluTest, GeluGluMatchesRef) {
  const int64_t n = GetParam();
  std::vector<float> gate = RandomVector(n, -12.0f, 12.0f, 10);
  const std::vector<float> up = RandomVector(n, -2.0f, 2.0f, 11);
  const float edges[] = {0.0f, -0.0f, 10.0f, -10.0f, 1e-8f, -1e-8f, 50.0f, -50.0f, 0.5f, -3.0f};
  for (int64_t i = 0; i < std::min<int64_t>(n, 10); ++i) gate[i * (n / 10 + 1) % n] = edges[i];
  std::vector<float> got(n), want(n);
  cpu::GeluGlu(gate.data(), up.data(), got.data(), n);
  ref::GeluGlu(gate.data(), up.data(), want.data(), n);
  std::vector<double> tol(n);
  for (int64_t i = 0; i < n; ++i) tol[i] = 8.0 * kEps * (std::abs(want[i]) + std::abs(gate[i] * up[i])) + 1e-30;
  EXPECT_TRUE(AllWithin(got, want, tol));
  // Its shape: gelu(0) = 0, gelu(g) -> g for large g, -> 0 for very negative g.
  EXPECT_EQ(got[0], 0.0f);
}

// ---------------------------------------------------------------------------
// Row-scaled int8 (the recall store's q8 records): the twins' bits exactly.

struct Int8RowsCase {
  int64_t rows, dim;
};

class Int8RowsTest : public ::testing::TestWithParam<Int8RowsCase> {};

TEST_P(Int8RowsTest, MatchesTwinBitForBit) {
  const Int8RowsCase c = GetParam();
  std::vector<float> x = RandomVector(c.rows * c.dim, -3.0f, 3.0f, 13);
  // Rows of their own: zeros (scale 0, every q 0), magnitudes from tiny to
  // huge, one large value among small ones, exact ties (max 127, so scale
  // 1: q = round-half-even(x)), and a row so small that its scale's
  // reciprocal overflows (every q 0, on every path); and rows with a NaN,
  // or infinities, in the vector part or the tail (scale NaN, every q 0).
  for (int64_t r = 0; r < c.rows; ++r) {
    float* row = x.data() + r * c.dim;
    switch (r % 9) {
      case 1:
        std::fill(row, row + c.dim, 0.0f);
        break;
      case 2:
        for (int64_t i = 0; i < c.dim; ++i) row[i] *= 1e-30f;
        break;
      case 3:
        for (int64_t i = 0; i < c.dim; ++i) row[i] *= 1e30f;
        break;
      case 4:
        row[(r * 7) % c.dim] = -1000.0f;
        break;
      case 5:
        for (int64_t i = 0; i < c.dim; ++i) row[i] = 0.5f * static_cast<float>((i * 37 + r) % 255) - 63.5f;
        row[c.dim - 1] = 127.0f;
        break;
      case 6:
        for (int64_t i = 0; i < c.dim; ++i) row[i] *= 1e-38f;
        break;
      case 7:
        row[(r * 5) % c.dim] = std::numeric_limits<float>::quiet_NaN();
        break;
      case 8:
        row[r % c.dim] = std::numeric_limits<float>::infinity();
        row[c.dim - 1] = -std::numeric_limits<float>::infinity();
        break;
      default:
        break;
    }
  }
  const int64_t bytes = Int8RowBytes(c.dim);
  std::vector<uint8_t> got(c.rows * bytes + 1, 0xAB), want(c.rows * bytes + 1, 0xCD);
  // (From an odd address: records are 4 + dim bytes apart, not aligned.)
  cpu::ToInt8Rows(x.data(), got.data() + 1, c.rows, c.dim);
  EncodeInt8Rows(x.data(), c.rows, c.dim, want.data() + 1);
  for (int64_t i = 1; i < c.rows * bytes + 1; ++i) {
    ASSERT_EQ(got[i], want[i]) << "row " << (i - 1) / bytes << " byte " << (i - 1) % bytes;
  }
  EXPECT_EQ(got[0], 0xAB) << "wrote before its output";

  std::vector<float> back(c.rows * c.dim + 1, -7.0f), twin(c.rows * c.dim);
  cpu::FromInt8Rows(got.data() + 1, back.data(), c.rows, c.dim);
  DecodeInt8Rows(want.data() + 1, c.rows, c.dim, twin.data());
  for (int64_t i = 0; i < c.rows * c.dim; ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(back[i]), std::bit_cast<uint32_t>(twin[i])) << i;  // (NaNs too)
  }
  EXPECT_EQ(back[c.rows * c.dim], -7.0f) << "wrote past its output";

  // What the records hold: every value within half a step of its row's
  // max|x| / 127, and the ties rounded to even.
  for (int64_t r = 0; r < c.rows; ++r) {
    const float* row = x.data() + r * c.dim;
    if (r % 9 >= 7) {
      float scale;
      std::memcpy(&scale, got.data() + 1 + r * bytes, sizeof(float));
      ASSERT_TRUE(std::isnan(scale)) << "row " << r << " is not finite; its scale is " << scale;
      for (int64_t i = 0; i < c.dim; ++i) {
        ASSERT_EQ(got[1 + r * bytes + sizeof(float) + i], 0) << r << " " << i;
        ASSERT_TRUE(std::isnan(back[r * c.dim + i])) << r << " " << i;
      }
      continue;
    }
    float amax = 0.0f;
    for (int64_t i = 0; i < c.dim; ++i) amax = std::max(amax, std::abs(row[i]));
    if (amax > 0 && !std::isfinite(1.0f / Int8RowScale(amax))) {
      for (int64_t i = 0; i < c.dim; ++i) ASSERT_EQ(back[r * c.dim + i], 0.0f) << "a tiny row " << r << " " << i;
      continue;
    }
    for (int64_t i = 0; i < c.dim; ++i) {
      ASSERT_LE(std::abs(back[r * c.dim + i] - row[i]), amax / 254 * 1.0001f) << r << " " << i;
    }
    if (r % 9 == 5 && c.dim > 1) {
      for (int64_t i = 0; i + 1 < c.dim; ++i) {
        ASSERT_EQ(back[r * c.dim + i], std::nearbyint(row[i])) << "a tie at " << row[i];
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Int8RowsTest,
                         ::testing::Values(Int8RowsCase{6, 1}, Int8RowsCase{12, 7}, Int8RowsCase{12, 8},
                                           Int8RowsCase{12, 31}, Int8RowsCase{12, 33}, Int8RowsCase{18, 64},
                                           Int8RowsCase{30, 128}, Int8RowsCase{12, 257},
                                           Int8RowsCase{1200, 128}),  // (over the team)
                         [](const ::testing::TestParamInfo<Int8RowsCase>& info) {
                           return "Cpu_rows" + std::to_string(info.param.rows) + "_dim" +
                                  std::to_string(info.param.dim);
                         });

// ---------------------------------------------------------------------------
// Pooling

struct PoolCase {
  int64_t n;
  int64_t kernel;
};

class PoolTest : public ::testing::TestWithParam<PoolCase> {};

TEST_P(PoolTest, AvgMatchesRef) {
  const PoolCase c = GetParam();
  const std::vector<float> in = RandomVector(c.n + 1, 0.0f, 1.0f, 10);
  std::vector<float> out_cpu(c.n), out_ref(c.n);
  cpu::AvgPool1d(in.data() + 1, out_cpu.data(), c.n, c.kernel);
  ref::AvgPool1d(in.data() + 1, out_ref.data(), c.n, c.kernel);
  std::vector<double> tol(c.n);
  for (int64_t i = 0; i < c.n; ++i) {
    double abs_sum = 0.0;
    for (int64_t t = std::max<int64_t>(0, i - c.kernel / 2);
         t <= std::min(c.n - 1, i + c.kernel / 2); ++t) {
      abs_sum += std::abs(in[1 + t]);
    }
    tol[i] = kEps * abs_sum + kEps * std::abs(out_ref[i]) + 1e-30;
  }
  EXPECT_TRUE(AllWithin(out_cpu, out_ref, tol));
}

TEST_P(PoolTest, MaxMatchesRefExactly) {
  const PoolCase c = GetParam();
  const std::vector<float> in = RandomVector(c.n + 1, -1.0f, 1.0f, 11);
  std::vector<float> out_cpu(c.n), out_ref(c.n);
  cpu::MaxPool1d(in.data() + 1, out_cpu.data(), c.n, c.kernel);
  ref::MaxPool1d(in.data() + 1, out_ref.data(), c.n, c.kernel);
  EXPECT_EQ(out_cpu, out_ref);
}

INSTANTIATE_TEST_SUITE_P(Shapes, PoolTest,
                         ::testing::Values(PoolCase{1, 1}, PoolCase{1, 7}, PoolCase{3, 5},
                                           PoolCase{17, 7}, PoolCase{111, 13}, PoolCase{4097, 7},
                                           PoolCase{5, 15}),
                         [](const ::testing::TestParamInfo<PoolCase>& info) {
                           return "Cpu_n" + std::to_string(info.param.n) + "_k" +
                                  std::to_string(info.param.kernel);
                         });

// Hand-computed PyTorch semantics: avg_pool1d([1,2,3,4], 3, stride 1,
// padding 1) = [(0+1+2)/3, 2, 3, (3+4+0)/3]; max_pool1d = [2, 3, 4, 4].
TEST(Pool1dSemantics, PadsCountAsZerosForAvgAndAreIgnoredForMax) {
  const float in[4] = {1, 2, 3, 4};
  float avg[4], mx[4];
  cpu::AvgPool1d(in, avg, 4, 3);
  cpu::MaxPool1d(in, mx, 4, 3);
  EXPECT_FLOAT_EQ(avg[0], 1.0f);
  EXPECT_FLOAT_EQ(avg[1], 2.0f);
  EXPECT_FLOAT_EQ(avg[2], 3.0f);
  EXPECT_FLOAT_EQ(avg[3], 7.0f / 3.0f);
  EXPECT_EQ(mx[0], 2.0f);
  EXPECT_EQ(mx[1], 3.0f);
  EXPECT_EQ(mx[2], 4.0f);
  EXPECT_EQ(mx[3], 4.0f);
  const float neg[3] = {-5, -1, -3};
  cpu::MaxPool1d(neg, mx, 3, 5);
  EXPECT_EQ(mx[0], -1.0f);  // pads would be 0 if they counted
  EXPECT_EQ(mx[2], -1.0f);
}

// ---------------------------------------------------------------------------
// TopKIndices

struct TopKCase {
  int64_t n;
  int64_t k;
  int num_levels;  // 0: continuous scores; else scores drawn from this many values (ties)
};

class TopKTest : public ::testing::TestWithParam<TopKCase> {};

TEST_P(TopKTest, SameSetAsRefAndSortedAscending) {
  const TopKCase c = GetParam();
  std::vector<float> s = RandomVector(c.n, -1.0f, 1.0f, 12);
  if (c.num_levels > 0) {
    for (float& x : s) x = std::floor((x + 1.0f) * 0.5f * c.num_levels);
  }
  const int64_t kk = std::min(c.k, c.n);
  std::vector<int32_t> got(kk, -1), want(kk, -2);
  cpu::TopKIndices(s.data(), c.n, c.k, got.data());
  ref::TopKIndices(s.data(), c.n, c.k, want.data());
  ASSERT_TRUE(std::is_sorted(got.begin(), got.end()));
  ASSERT_EQ(std::set<int32_t>(got.begin(), got.end()).size(), static_cast<size_t>(kk));
  // Same scores on both sides, so with the tie rule the sets are identical.
  EXPECT_EQ(got, want);
  // Independent check of the rule: every kept position beats every dropped one.
  std::vector<bool> kept(c.n, false);
  for (int32_t p : got) kept[p] = true;
  float min_kept = std::numeric_limits<float>::infinity();
  int64_t last_kept_at_min = -1;
  for (int32_t p : got) {
    if (s[p] < min_kept || (s[p] == min_kept && p > last_kept_at_min)) {
      min_kept = s[p];
      last_kept_at_min = p;
    }
  }
  for (int64_t i = 0; i < c.n; ++i) {
    if (kept[i]) continue;
    ASSERT_TRUE(s[i] < min_kept || (s[i] == min_kept && i > last_kept_at_min))
        << "dropped position " << i << " (score " << s[i] << ") beats kept position "
        << last_kept_at_min << " (score " << min_kept << ")";
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, TopKTest,
                         ::testing::Values(TopKCase{1, 1, 0}, TopKCase{3, 5, 0}, TopKCase{17, 3, 0},
                                           TopKCase{111, 17, 3}, TopKCase{4097, 1024, 0},
                                           TopKCase{4097, 1000, 7}, TopKCase{4097, 4097, 2},
                                           TopKCase{4097, 4096, 3}, TopKCase{1000, 1, 5}),
                         [](const ::testing::TestParamInfo<TopKCase>& info) {
                           return "Cpu_n" + std::to_string(info.param.n) + "_k" +
                                  std::to_string(info.param.k) + "_levels" +
                                  std::to_string(info.param.num_levels);
                         });

TEST(TopKTies, LowerPositionWinsAmongEqualScores) {
  const std::vector<float> flat(10, 0.5f);
  std::vector<int32_t> out(4);
  cpu::TopKIndices(flat.data(), 10, 4, out.data());
  EXPECT_EQ(out, (std::vector<int32_t>{0, 1, 2, 3}));
  //                                 0  1  2  3  4  5  6  7
  const std::vector<float> s = {1, 3, 2, 3, 2, 0, 2, 3};
  std::vector<int32_t> top5(5);
  cpu::TopKIndices(s.data(), 8, 5, top5.data());
  // The three 3s (1, 3, 7), then the 2s at the lowest positions (2, 4).
  EXPECT_EQ(top5, (std::vector<int32_t>{1, 2, 3, 4, 7}));
  std::vector<int32_t> top5_ref(5);
  ref::TopKIndices(s.data(), 8, 5, top5_ref.data());
  EXPECT_EQ(top5_ref, top5);
}

// ---------------------------------------------------------------------------
// TopSpanIndices: the lazily sorted walk against the twin's search of
// every entry per peak, on continuous scores and on few levels (ties, and
// spans that meet), spans from 1 (TopKIndices' entries) to wider than n.

TEST(TopSpanTest, TheWalkTakesWhatTheTwinTakes) {
  int cases = 0;
  for (const int64_t n : {1, 2, 7, 64, 65, 300, 2049}) {
    for (const int levels : {0, 2, 5}) {
      std::vector<float> s = RandomVector(n, -1.0f, 1.0f, static_cast<uint32_t>(n * 7 + levels));
      if (levels > 0) {
        for (float& x : s) x = std::floor((x + 1.0f) * 0.5f * levels);
      }
      for (const int64_t k : {int64_t{0}, int64_t{1}, n / 3, n / 2 + 1, n - 1, n}) {
        for (const int64_t span : {1, 2, 3, 32, 33, 5000}) {
          if (k < 0) continue;
          std::vector<int32_t> got(k, -1), want(k, -2);
          cpu::TopSpanIndices(s.data(), n, k, span, got.data());
          ref::TopSpanIndices(s.data(), n, k, span, want.data());
          const std::string where = ::testing::PrintToString(std::vector<int64_t>{n, levels, k, span});
          ASSERT_EQ(got, want) << where;
          ASSERT_TRUE(std::is_sorted(got.begin(), got.end())) << where;
          ASSERT_EQ(std::set<int32_t>(got.begin(), got.end()).size(), static_cast<size_t>(k)) << where;
          if (span == 1) {
            std::vector<int32_t> top(k);
            cpu::TopKIndices(s.data(), n, k, top.data());
            ASSERT_EQ(got, top) << where;
          }
          ++cases;
        }
      }
    }
  }
  EXPECT_GT(cases, 700);
  // Past 65,536 entries the tiles hold 64 (at most 2,048 tiles).
  const int64_t n = 70000;
  std::vector<float> s = RandomVector(n, -1.0f, 1.0f, 5);
  for (float& x : s) x = std::floor((x + 1.0f) * 40.0f);
  for (const int64_t k : {int64_t{100}, n / 3}) {
    std::vector<int32_t> got(k), want(k);
    cpu::TopSpanIndices(s.data(), n, k, 33, got.data());
    ref::TopSpanIndices(s.data(), n, k, 33, want.data());
    EXPECT_EQ(got, want) << k;
  }
}

TEST(TopSpanTest, NearestFirstLowerSideFirst) {
  //                             0  1  2  3  4  5  6  7  8  9
  const std::vector<float> s = {0, 1, 0, 0, 9, 0, 0, 0, 8, 0};
  std::vector<int32_t> out(4);
  // Spans of 5 (two each side): 4, then 3 before 5 at distance 1, then 2.
  cpu::TopSpanIndices(s.data(), 10, 4, 5, out.data());
  EXPECT_EQ(out, (std::vector<int32_t>{2, 3, 4, 5}));
  // Seven: 4's span of five, then the next peak, 8 (not 1: 8 scores more).
  out.resize(7);
  cpu::TopSpanIndices(s.data(), 10, 7, 5, out.data());
  EXPECT_EQ(out, (std::vector<int32_t>{2, 3, 4, 5, 6, 7, 8}));
  // Nine: 8 takes 7 and 9 (6 is 4's already), then the next peak is 1, not
  // the 0 before 2.
  out.resize(9);
  cpu::TopSpanIndices(s.data(), 10, 9, 5, out.data());
  EXPECT_EQ(out, (std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8, 9}));
  std::vector<int32_t> twin(9);
  ref::TopSpanIndices(s.data(), 10, 9, 5, twin.data());
  EXPECT_EQ(twin, out);
}

// ---------------------------------------------------------------------------
// Softmax and Argmax

class SoftmaxTest : public ::testing::TestWithParam<int64_t> {};

TEST_P(SoftmaxTest, MatchesRefAndSumsToOne) {
  const int64_t n = GetParam();
  const std::vector<float> x = RandomVector(n + 1, -20.0f, 20.0f, 13);
  std::vector<float> got(x.begin() + 1, x.end()), want = got;
  cpu::Softmax(got.data(), n);
  ref::Softmax(want.data(), n);
  const float mx = *std::max_element(x.begin() + 1, x.end());
  std::vector<double> tol(n);
  for (int64_t i = 0; i < n; ++i) {
    tol[i] = (n + 4.0 + 0.5 * std::abs(x[1 + i] - mx)) * kEps * want[i] + 1e-37;
  }
  EXPECT_TRUE(AllWithin(got, want, tol));
  double sum = 0.0;
  for (float p : got) sum += p;
  EXPECT_NEAR(sum, 1.0, (2.0 * n + 4.0) * kEps);
}

INSTANTIATE_TEST_SUITE_P(Sizes, SoftmaxTest, ::testing::Values(1, 3, 17, 111, 4097, 49152),
                         [](const ::testing::TestParamInfo<int64_t>& info) {
                           return "Cpu_n" + std::to_string(info.param);
                         });

TEST(Argmax, FirstIndexOfTheMaximum) {
  const std::vector<float> x = {1, 5, -2, 5, 4};
  EXPECT_EQ(cpu::Argmax(x.data(), 5), 1);
  EXPECT_EQ(ref::Argmax(x.data(), 5), 1);
  EXPECT_EQ(cpu::Argmax(x.data() + 2, 3), 1);
  const std::vector<float> one = {-3};
  EXPECT_EQ(cpu::Argmax(one.data(), 1), 0);
  const std::vector<float> r = RandomVector(49153, -1.0f, 1.0f, 14);
  EXPECT_EQ(cpu::Argmax(r.data(), 49153), ref::Argmax(r.data(), 49153));
}

}  // namespace
}  // namespace snapfill

namespace snapfill {
namespace {

// Positions below 2^16 use a cached cos/sin table; others (here forced by a
// negative position in the same call) compute the angles per token. Both
// must give bit-identical rotations.
TEST(RopeTableTest, CachedAnglesEqualComputedAngles) {
  const int64_t n = 200, heads = 3, d = 64;
  std::vector<float> x(n * heads * d);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37 * i);
  std::vector<int32_t> pos(n);
  for (int64_t t = 0; t < n; ++t) pos[t] = static_cast<int32_t>(t * 97 % 5000);
  std::vector<float> cached = x;
  cpu::Rope(cached.data(), n, heads, d, heads * d, pos.data(), d, 100000.0f, 1.0f, false);
  std::vector<float> computed = x;
  computed.resize((n + 1) * heads * d, 1.0f);
  std::vector<int32_t> pos2 = pos;
  pos2.push_back(-1);
  cpu::Rope(computed.data(), n + 1, heads, d, heads * d, pos2.data(), d, 100000.0f, 1.0f, false);
  for (size_t i = 0; i < cached.size(); ++i) ASSERT_EQ(cached[i], computed[i]) << i;
}

// Layers that turn by different bases (Gemma 3's local and global layers)
// keep a table each: alternating between them computes no table again (the
// thread's buffers do not change), the rotations are the same bits, and the
// tables kept stay bounded (4) however many bases come by.
TEST(RopeTableTest, AlternatingBasesKeepATableEach) {
  const int64_t n = 1000, heads = 2, d = 64;
  std::vector<int32_t> pos(n);
  std::iota(pos.begin(), pos.end(), 0);
  std::vector<float> x0(n * heads * d);
  for (size_t i = 0; i < x0.size(); ++i) x0[i] = std::cos(0.11 * i);
  auto rotate = [&](float base) {
    std::vector<float> x = x0;
    cpu::Rope(x.data(), n, heads, d, heads * d, pos.data(), d, base, 1.0f, true);
    return x;
  };
  cpu::internal::ThreadScratch& scratch = cpu::internal::CurrentScratch();
  scratch.Clear();
  const std::vector<float> local = rotate(10000.0f);
  const uint64_t one = scratch.bytes();
  const std::vector<float> global = rotate(1000000.0f);
  const uint64_t two = scratch.bytes();
  const uint64_t table = static_cast<uint64_t>(n) * d * sizeof(float);
  EXPECT_GE(two, one + table) << "the second base's table replaced the first's";
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(rotate(10000.0f), local);
    EXPECT_EQ(rotate(1000000.0f), global);
  }
  EXPECT_EQ(scratch.bytes(), two) << "a table was made again";
  for (int b = 0; b < 8; ++b) rotate(500.0f * (b + 1));
  EXPECT_LE(scratch.bytes(), two + 2 * (two - one)) << "more than 4 tables kept";
  scratch.Clear();
}

// The tables together hold at most one table of 2^16 positions of 256
// angles (64 MiB): at positions past 32K a second base of head_dim 256
// computes its angles itself, to the same bits as a table would give.
TEST(RopeTableTest, TablesTogetherStayWithinOneLargestTable) {
  const int64_t d = 256;
  const std::vector<int32_t> pos = {3, 40000, 17};
  std::vector<int32_t> computed_pos = pos;
  computed_pos.push_back(-1);  // (a negative position: no table for the call)
  std::vector<float> x0(computed_pos.size() * d);
  for (size_t i = 0; i < x0.size(); ++i) x0[i] = std::sin(0.21 * i);
  auto rotate = [&](const std::vector<int32_t>& p, float base) {
    std::vector<float> x(x0.begin(), x0.begin() + p.size() * d);
    cpu::Rope(x.data(), static_cast<int64_t>(p.size()), 1, d, d, p.data(), d, base, 1.0f, true);
    x.resize(pos.size() * d);
    return x;
  };
  cpu::internal::ThreadScratch& scratch = cpu::internal::CurrentScratch();
  scratch.Clear();
  for (const float base : {10000.0f, 1000000.0f}) {
    EXPECT_EQ(rotate(pos, base), rotate(computed_pos, base)) << base;
  }
  EXPECT_LE(scratch.bytes(), (uint64_t{64} << 20) + (1 << 16));
  EXPECT_GE(scratch.bytes(), uint64_t{40001} * d * sizeof(float)) << "the first base had no table";
  scratch.Clear();
}

}  // namespace
}  // namespace snapfill
