// SmartKV's gates (src/compress/gate.h): the forward pass against its
// scalar twin, a fit that recovers a planted rule, and the gate file's
// checks.
#include "src/compress/gate.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/ops.h"
#include "kernels/ref/ops_ref.h"
#include "snapfill/backend.h"
#include "tests/testing/status_matchers.h"

namespace snapfill {
namespace {

GateModel RandomGates(int64_t layers, int64_t heads, int64_t d, int64_t hidden, uint32_t seed) {
  GateModel g = GateModel::Create(layers, heads, d, hidden).value();
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 0.5f);
  for (int64_t l = 0; l < layers; ++l) {
    for (int64_t h = 0; h < heads; ++h) {
      GateParams& p = g.params(l, h);
      for (float& x : p.mean) x = n(rng);
      for (float& x : p.inv_std) x = 0.5f + std::fabs(n(rng));
      for (float& x : p.w1) x = n(rng);
      for (float& x : p.b1) x = n(rng);
      for (float& x : p.w2) x = n(rng);
      p.b2 = n(rng);
    }
  }
  g.set_tau(2.0f);
  g.set_fingerprint("xxh3:0123456789abcdef");
  return g;
}

TEST(GateTest, PredictMatchesScalarTwin) {
  for (const auto [d, hidden, n] : {std::tuple{64, 32, 300}, {17, 5, 7}, {128, 256, 65}, {64, 1, 1}}) {
    const GateModel g = RandomGates(2, 3, d, hidden, 7 + d);
    const int64_t stride = d + 3;
    std::vector<float> keys(n * stride);
    std::mt19937 rng(11);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (float& x : keys) x = dist(rng);
    for (int64_t l = 0; l < 2; ++l) {
      for (int64_t h = 0; h < 3; ++h) {
        std::vector<float> got(n + 1, -7.0f), want(n);
        g.Predict(l, h, keys.data(), stride, n, got.data());
        const GateParams& p = g.params(l, h);
        ref::GateForward(p.mean.data(), p.inv_std.data(), p.w1.data(), p.b1.data(), p.w2.data(), p.b2, d, hidden,
                         keys.data(), stride, n, want.data());
        for (int64_t i = 0; i < n; ++i) {
          EXPECT_NEAR(got[i], want[i], 1e-4 * (1 + std::fabs(want[i]))) << d << "/" << hidden << " row " << i;
        }
        EXPECT_EQ(got[n], -7.0f) << "wrote past the rows";
        // The pruner's scores (Backend::GateScores, kernels/cpu) are the
        // gate's as it was fitted, bit for bit.
        const std::vector<float> packed = g.Packed();
        std::vector<float> kernel(n);
        cpu::GateScores(packed.data() + (l * 3 + h) * Backend::GateParamFloats(d, hidden), d, hidden, keys.data(),
                        stride, n, kernel.data());
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(kernel[i], got[i]) << d << "/" << hidden << " row " << i;
      }
    }
  }
}

// Samples whose lifespan follows a planted direction of the key: entries
// whose key points along u live longest (log4 lifespan 4·sigmoid(2 k·u),
// plus noise), and a fifth of them are censored (seen alive at a random
// fraction of their life). The fit ranks held-out entries as the rule does
// and its error is a fraction of a constant's.
GateSamples Planted(int64_t n, int64_t d, const std::vector<float>& u, uint32_t seed) {
  GateSamples s;
  s.head_dim = d;
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  for (int64_t i = 0; i < n; ++i) {
    float dot = 0;
    for (int64_t t = 0; t < d; ++t) {
      const float x = dist(rng) * (1.0f + t % 3) + 0.3f * t;  // scales and offsets to normalize
      s.keys.push_back(x);
      dot += (x - 0.3f * t) / (1.0f + t % 3) * u[t];
    }
    const float life = 4.0f / (1.0f + std::exp(-2.0f * dot)) + 0.1f * dist(rng);
    const bool censored = unit(rng) < 0.2f;
    s.label.push_back(censored ? life * unit(rng) : life);
    s.censored.push_back(censored);
  }
  return s;
}

TEST(GateTest, FitRecoversAPlantedRule) {
  const int64_t d = 64;
  std::vector<float> u(d);
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  float norm = 0;
  for (float& x : u) norm += (x = dist(rng)) * x;
  for (float& x : u) x /= std::sqrt(norm);
  const GateSamples train = Planted(6000, d, u, 1), held = Planted(1000, d, u, 2);
  GateModel g = GateModel::Create(1, 1, d, 32).value();
  GateFitOptions options;
  options.epochs = 25;
  auto report = FitGate(train, held, options, g.params(0, 0));
  SNAPFILL_ASSERT_OK(report);
  std::printf("planted rule: held-out MAE %.3f, constant %.3f, rank correlation %.3f\n", report->mae,
              report->baseline_mae, report->rank_correlation);
  EXPECT_EQ(report->train, 6000);
  EXPECT_EQ(report->validation, 1000);
  // Measured: MAE 0.20 against the constant's 0.96, rank correlation 0.99
  // (the labels' noise alone is 0.08).
  EXPECT_LT(report->mae, 0.25 * report->baseline_mae) << report->mae << " vs " << report->baseline_mae;
  EXPECT_GT(report->rank_correlation, 0.95);
  // The entries along u are predicted to live longest.
  std::vector<float> along(d), against(d);
  for (int64_t t = 0; t < d; ++t) {
    along[t] = 2.0f * u[t] * (1.0f + t % 3) + 0.3f * t;
    against[t] = -2.0f * u[t] * (1.0f + t % 3) + 0.3f * t;
  }
  float y_along, y_against;
  g.Predict(0, 0, along.data(), d, 1, &y_along);
  g.Predict(0, 0, against.data(), d, 1, &y_against);
  EXPECT_GT(y_along, 3.0f);
  EXPECT_LT(y_against, 1.0f);
  // Bad input is refused.
  GateSamples empty;
  empty.head_dim = d;
  EXPECT_TRUE(absl::IsInvalidArgument(FitGate(empty, held, options, g.params(0, 0)).status()));
}

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

TEST(GateFileTest, RoundTripsAndRefusesBadFiles) {
  const GateModel g = RandomGates(3, 2, 16, 8, 5);
  const std::string path = ::testing::TempDir() + "/gate_test.gates";
  std::remove(path.c_str());
  SNAPFILL_ASSERT_OK(g.Save(path, /*overwrite=*/false));
  EXPECT_TRUE(absl::IsAlreadyExists(g.Save(path, /*overwrite=*/false)));
  const std::string bytes = ReadAll(path);
  EXPECT_EQ(bytes.size(), g.file_bytes());
  auto loaded = GateModel::Load(path, "xxh3:0123456789abcdef");
  SNAPFILL_ASSERT_OK(loaded);
  EXPECT_EQ(loaded->tau(), 2.0f);
  for (int64_t l = 0; l < 3; ++l) {
    for (int64_t h = 0; h < 2; ++h) {
      EXPECT_EQ(loaded->params(l, h).w1, g.params(l, h).w1);
      EXPECT_EQ(loaded->params(l, h).b2, g.params(l, h).b2);
    }
  }
  // Another model's gates.
  auto other = GateModel::Load(path, "xxh3:ffffffffffffffff");
  EXPECT_TRUE(absl::IsFailedPrecondition(other.status())) << other.status();
  EXPECT_NE(other.status().message().find("xxh3:0123456789abcdef"), std::string::npos);
  // Truncated, damaged, with trailing bytes, another kind of file.
  auto parse = [](const std::string& b) { return GateModel::Parse(b, "g", "").status(); };
  EXPECT_TRUE(absl::IsDataLoss(parse(bytes.substr(0, bytes.size() - 9))));
  EXPECT_TRUE(absl::IsDataLoss(parse(bytes.substr(0, 40))));
  std::string flipped = bytes;
  flipped[bytes.size() / 2] ^= 0x10;
  const absl::Status damaged = parse(flipped);
  EXPECT_TRUE(absl::IsDataLoss(damaged));
  EXPECT_NE(damaged.message().find("checksum"), std::string::npos) << damaged;
  EXPECT_TRUE(absl::IsDataLoss(parse(bytes + "x")));
  EXPECT_TRUE(absl::IsDataLoss(parse("SNAPFILL-KV" + std::string(40, '\0'))));
  EXPECT_TRUE(absl::IsDataLoss(parse("")));
  // A newer and an older version.
  std::string newer = bytes, older = bytes;
  const uint32_t v_new = kGateFileVersion + 1, v_old = 0;
  std::memcpy(newer.data() + 12, &v_new, 4);
  std::memcpy(older.data() + 12, &v_old, 4);
  EXPECT_TRUE(absl::IsUnimplemented(parse(newer)));
  EXPECT_TRUE(absl::IsFailedPrecondition(parse(older)));
  EXPECT_TRUE(absl::IsNotFound(GateModel::Load(path + ".missing", "").status()));
  std::remove(path.c_str());
  EXPECT_TRUE(absl::IsInvalidArgument(GateModel::Create(0, 1, 64, 32).status()));
}

}  // namespace
}  // namespace snapfill
