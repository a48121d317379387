#include "src/engine/sampler.h"

#include <cmath>
#include <map>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace snapfill {
namespace {

TEST(SamplerTest, GreedyIsArgmaxFirstOnTies) {
  std::vector<float> logits = {0.5f, 3.0f, -1.0f, 3.0f, 2.9f};
  Sampler s({/*temperature=*/0.0f});
  EXPECT_EQ(s.Sample(logits.data(), logits.size()), 1);
  EXPECT_EQ(Argmax(logits.data(), logits.size()), 1);
}

// Argmax against the plain scan (first index of the largest; a NaN never
// wins except at index 0): lengths around the 16 lanes, values drawn from a
// few levels so that ties fall in different lanes and across the tail, with
// NaN, infinities and signed zeros among them.
TEST(SamplerTest, ArgmaxIsThePlainScan) {
  auto scan = [](const std::vector<float>& v) {
    int32_t best = 0;
    for (size_t i = 1; i < v.size(); ++i) {
      if (v[i] > v[best]) best = static_cast<int32_t>(i);
    }
    return best;
  };
  const float levels[] = {-1.0f, 0.0f, -0.0f, 2.5f, 7.0f, -INFINITY, INFINITY, NAN};
  uint64_t state = 12345;
  auto next = [&state] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<uint32_t>(state >> 33);
  };
  int checked = 0;
  for (int64_t n : {1, 2, 15, 16, 17, 31, 32, 33, 100, 49152}) {
    for (int trial = 0; trial < 40; ++trial) {
      // Trials draw from the first 3..8 levels: some without NaN or inf.
      const int num_levels = 3 + trial % 6;
      std::vector<float> v(n);
      for (float& x : v) x = levels[next() % num_levels];
      if (trial % 5 == 0) v[next() % n] = 9.0f;  // one clear winner somewhere
      ASSERT_EQ(Argmax(v.data(), n), scan(v)) << "n " << n << " trial " << trial;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 400);
  const std::vector<float> nan_first = {NAN, 1.0f, 2.0f};
  EXPECT_EQ(Argmax(nan_first.data(), 3), 0);
  const std::vector<float> late = {0.0f, 1.0f, 1.0f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f,
                                   0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 3.0f, 3.0f};
  EXPECT_EQ(Argmax(late.data(), late.size()), 17);  // in the tail past the lanes, first of two
}

TEST(SamplerTest, TopKOneIsGreedyAtAnyTemperature) {
  std::vector<float> logits = {0.1f, 0.2f, 5.0f, 0.3f};
  Sampler s({/*temperature=*/2.0f, /*top_k=*/1, /*top_p=*/1.0f, /*seed=*/7});
  for (int i = 0; i < 50; ++i) EXPECT_EQ(s.Sample(logits.data(), logits.size()), 2);
}

TEST(SamplerTest, SameSeedSameSequence) {
  std::vector<float> logits(100);
  for (int i = 0; i < 100; ++i) logits[i] = std::sin(i * 0.37f);
  Sampler a({1.0f, 0, 1.0f, 42}), b({1.0f, 0, 1.0f, 42}), c({1.0f, 0, 1.0f, 43});
  int differ = 0;
  for (int i = 0; i < 200; ++i) {
    const int32_t x = a.Sample(logits.data(), logits.size());
    EXPECT_EQ(x, b.Sample(logits.data(), logits.size()));
    differ += x != c.Sample(logits.data(), logits.size());
  }
  EXPECT_GT(differ, 100);  // a different seed gives a different sequence
}

// Frequencies follow softmax(logits / T): each within 5 standard deviations
// of its binomial expectation over 40000 draws.
TEST(SamplerTest, FrequenciesMatchSoftmax) {
  const std::vector<float> logits = {1.0f, 2.0f, 0.0f, 1.5f};
  const float temp = 0.7f;
  std::vector<double> p(logits.size());
  double z = 0;
  for (size_t i = 0; i < p.size(); ++i) z += p[i] = std::exp(logits[i] / temp);
  for (double& x : p) x /= z;
  Sampler s({temp, 0, 1.0f, 123});
  const int draws = 40000;
  std::vector<int> count(logits.size());
  for (int i = 0; i < draws; ++i) count[s.Sample(logits.data(), logits.size())]++;
  for (size_t i = 0; i < p.size(); ++i) {
    const double sd = std::sqrt(draws * p[i] * (1 - p[i]));
    EXPECT_NEAR(count[i], draws * p[i], 5 * sd) << "token " << i;
  }
}

// With top_p the smallest set of most likely tokens whose mass reaches p is
// kept: here probabilities are about {0.64, 0.24, 0.09, 0.03}, so p = 0.8
// keeps the first two and never draws the others.
TEST(SamplerTest, TopPDropsTheTail) {
  const std::vector<float> logits = {3.0f, 2.0f, 1.0f, 0.0f};
  Sampler s({1.0f, 0, 0.8f, 5});
  std::map<int, int> seen;
  for (int i = 0; i < 5000; ++i) seen[s.Sample(logits.data(), logits.size())]++;
  EXPECT_EQ(seen.count(2), 0u);
  EXPECT_EQ(seen.count(3), 0u);
  EXPECT_GT(seen[0], seen[1]);
  EXPECT_GT(seen[1], 0);
}

TEST(SamplerTest, ValidationNamesTheFlag) {
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateSamplingParams({-1.0f})));
  auto s = ValidateSamplingParams({1.0f, 40, 1.5f});
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_NE(s.message().find("top_p"), std::string::npos);
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateSamplingParams({1.0f, -3, 0.9f})));
  SNAPFILL_EXPECT_OK(ValidateSamplingParams({0.8f, 40, 0.95f}));
}

}  // namespace
}  // namespace snapfill
