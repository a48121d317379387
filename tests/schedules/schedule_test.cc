// Tests of the size-schedule planners (schedules/, include/snapfill/schedule.h).
//
// Expected values are derived independently of the implementation: the
// growth curves from their floating-point formulas (DESIGN §5, paper eq. 1,
// 8, 9), the worked examples by hand (the arithmetic is in the comments).
#include "snapfill/schedule.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace snapfill {
namespace {

using ::testing::HasSubstr;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

std::vector<int64_t> Chunks(const SchedulePlan& plan) {
  std::vector<int64_t> out;
  for (const ScheduleStep& s : plan.steps) out.push_back(s.chunk_tokens);
  return out;
}

double MeanBudget(const ScheduleStep& step) {
  return std::accumulate(step.budget.begin(), step.budget.end(), 0.0) /
         static_cast<double>(step.budget.size());
}

bool HasWarning(const SchedulePlan& plan, const std::string& needle) {
  for (const std::string& w : plan.warnings) {
    if (w.find(needle) != std::string::npos) return true;
  }
  return false;
}

// The curve a layer follows (DESIGN §5): square-sqrt is square in the lower
// half, sqrt in the upper half, linear for the middle layer of an odd count.
double CurveFraction(Growth growth, int64_t layer, int64_t num_layers, double x) {
  if (growth == Growth::kSquareSqrt) {
    if (2 * layer + 1 < num_layers) return x * x;
    if (2 * layer + 1 > num_layers) return std::sqrt(x);
    return x;
  }
  if (growth == Growth::kSqrt) return std::sqrt(x);
  if (growth == Growth::kSquare) return x * x;
  return x;  // linear, and adaptive's linear base
}

// ---------------------------------------------------------------------------
// Invariants over kind × growth × a grid of (L, c, m_max, w, layers, sinks).

struct GridCase {
  const char* name;
  int64_t total_tokens;
  int64_t chunk;
  int64_t memory;
  int64_t window;
  int64_t num_layers;
  int64_t sink_tokens;
};

const GridCase kGrid[] = {
    {"L32768_c1024_m1024", 32768, 1024, 1024, 32, 4, 0},
    {"L10000_c1024_m1024", 10000, 1024, 1024, 32, 3, 0},      // L not divisible by c
    {"L1025_c1024_m512", 1025, 1024, 512, 32, 2, 0},           // L just above c
    {"L10260_c1024_m1024", 10 * 1024 + 20, 1024, 1024, 32, 2, 0},  // tail 20 <= w: merged
    {"L10273_c1024_m1024", 10 * 1024 + 33, 1024, 1024, 32, 2, 0},  // tail 33 > w: kept
    {"L1M_c1024_m1024", 1000000, 1024, 1024, 32, 2, 0},
    {"L1Mi_c1024_m1024", 1 << 20, 1024, 1024, 32, 2, 0},
    {"L500_c1024_m256", 500, 1024, 256, 32, 3, 0},             // one chunk
    {"L8192_c2200_m4096", 8192, 2200, 4096, 32, 5, 0},
    {"L65536_c4096_m2048_w64", 65536, 4096, 2048, 64, 7, 0},   // odd layer count
    {"L4099_c64_m64_w16", 4099, 64, 64, 16, 3, 0},             // many small chunks
    {"L32768_c1024_m1024_s4", 32768, 1024, 1024, 32, 4, 4},    // attention sinks
};

using GridParam = std::tuple<ScheduleKind, Growth, GridCase>;

class ScheduleGridTest : public ::testing::TestWithParam<GridParam> {
 protected:
  ScheduleConfig Config() const {
    const auto& [kind, growth, g] = GetParam();
    ScheduleConfig c;
    c.total_tokens = g.total_tokens;
    c.chunk = g.chunk;
    c.memory = g.memory;
    c.window = g.window;
    c.num_layers = g.num_layers;
    c.sink_tokens = g.sink_tokens;
    c.kind = kind;
    c.growth = growth;
    return c;
  }
};

TEST_P(ScheduleGridTest, PlanHoldsItsInvariants) {
  const ScheduleConfig config = Config();
  const auto& [kind, growth, g] = GetParam();
  const auto plan_or = PlanSchedule(config);
  SNAPFILL_ASSERT_OK(plan_or);
  const SchedulePlan& plan = *plan_or;
  const int64_t n = static_cast<int64_t>(plan.steps.size());
  ASSERT_GE(n, 1);
  const int64_t w = config.window;
  const int64_t m_max = config.memory;
  const int64_t big_n = config.num_layers;

  // Every token exactly once, in order, in chunks longer than the window.
  int64_t next = 0;
  for (int64_t i = 0; i < n; ++i) {
    const ScheduleStep& step = plan.steps[i];
    EXPECT_EQ(step.start_token, next) << "step " << i;
    EXPECT_GT(step.chunk_tokens, w) << "step " << i;
    next += step.chunk_tokens;
    ASSERT_EQ(static_cast<int64_t>(step.budget.size()), big_n) << "step " << i;
    for (int64_t l = 0; l < big_n; ++l) EXPECT_GE(step.budget[l], w) << "step " << i << " layer " << l;
  }
  EXPECT_EQ(next, config.total_tokens);
  for (int64_t l = 0; l < big_n; ++l) EXPECT_EQ(plan.steps.back().budget[l], m_max) << "layer " << l;

  // Chunk counts: ⌈L/c⌉ (the IMDC authors' n), minus one for FM/IM when the
  // remainder is at or below the window and joins the chunk before it.
  const int64_t ref_n = CeilDiv(config.total_tokens, config.chunk);
  const int64_t tail = config.total_tokens - (ref_n - 1) * config.chunk;
  if (kind == ScheduleKind::kIncrementalDecremental) {
    EXPECT_EQ(n, ref_n);
  } else {
    const bool merged = ref_n > 1 && tail <= w;
    EXPECT_EQ(n, merged ? ref_n - 1 : ref_n);
    for (int64_t i = 0; i + 1 < n; ++i) EXPECT_EQ(plan.steps[i].chunk_tokens, config.chunk);
    EXPECT_EQ(plan.steps.back().chunk_tokens,
              n == 1 ? config.total_tokens : (merged ? config.chunk + tail : tail));
  }

  if (kind == ScheduleKind::kFixed) {
    for (const ScheduleStep& step : plan.steps) {
      for (int64_t b : step.budget) EXPECT_EQ(b, m_max);
    }
    EXPECT_EQ(plan.mean_memory, static_cast<double>(m_max));
    EXPECT_FALSE(plan.adaptive);
    return;
  }

  // m0: max(w, ⌊m_max / n⌋) by default (DESIGN §5); m_max when n = 1.
  const int64_t m0 = n == 1 ? m_max : std::max(w, m_max / n);
  EXPECT_EQ(plan.config.first_memory, m0);
  for (int64_t l = 0; l < big_n; ++l) {
    EXPECT_EQ(plan.steps[0].budget[l], n == 1 ? m_max : m0);
    for (int64_t i = 1; i < n; ++i) {
      EXPECT_GE(plan.steps[i].budget[l], plan.steps[i - 1].budget[l])
          << "IM sizes must not decrease: step " << i << " layer " << l;
    }
  }
  // Each size is the floor of its curve: b <= exact < b + 1.
  if (n > 1) {
    for (int64_t i = 0; i < n; ++i) {
      const double x = static_cast<double>(i) / static_cast<double>(n - 1);
      for (int64_t l = 0; l < big_n; ++l) {
        const double exact =
            m0 + static_cast<double>(m_max - m0) * CurveFraction(growth, l, big_n, x);
        const double b = static_cast<double>(plan.steps[i].budget[l]);
        EXPECT_LE(b, exact + 1e-6) << "step " << i << " layer " << l;
        EXPECT_GT(b, exact - 1 - 1e-6) << "step " << i << " layer " << l;
      }
    }
  }
  EXPECT_EQ(plan.adaptive, growth == Growth::kAdaptive);

  // m̂ as DESIGN defines it, recomputed from the budgets.
  double m_hat = 0;
  for (int64_t i = 0; i + 1 < n; ++i) m_hat += MeanBudget(plan.steps[i]);
  m_hat = n > 1 ? m_hat / static_cast<double>(n - 1) : static_cast<double>(m_max);
  EXPECT_NEAR(plan.mean_memory, m_hat, 1e-9 * m_hat);

  if (kind == ScheduleKind::kIncrementalDecremental && n > 1) {
    // c_i + m_{i-1} is the same for 0 < i < n-1: exactly when all layers have
    // the same budget, within one token when square-sqrt makes the mean over
    // layers fractional.
    std::vector<double> attention;  // [i - 1] = c_i + mean m_{i-1}
    for (int64_t i = 1; i < n; ++i) {
      attention.push_back(plan.steps[i].chunk_tokens + MeanBudget(plan.steps[i - 1]));
    }
    // Steps 1..n-2 (step 1 alone when n = 2).
    const auto middle_end = attention.begin() + std::max<int64_t>(1, n - 2);
    const double lo = *std::min_element(attention.begin(), middle_end);
    const double hi = *std::max_element(attention.begin(), middle_end);
    if (growth == Growth::kSquareSqrt && big_n > 1) {
      EXPECT_LT(hi - lo, 1.0);
    } else {
      EXPECT_EQ(hi, lo) << "attention length must be constant for 0 < i < n-1";
    }
    // That constant is c̄ + m̂ with c̄ = L/n (paper eq. 6), up to rounding, and
    // neither step 0 nor the last step exceeds it by more than the rounding
    // (steps after the first also read the s sinks).
    const double target = static_cast<double>(config.total_tokens) / n + m_hat;
    const double s = static_cast<double>(config.sink_tokens);
    EXPECT_NEAR(attention[0], target, 1.0 + 1e-9);
    EXPECT_LE(attention.back(), target + 1.0 + 1e-9);
    EXPECT_LE(static_cast<double>(plan.steps[0].chunk_tokens), target + s + 1.0 + 1e-9);
    if (growth == Growth::kSquareSqrt) {
      // The attention length is per layer; the sqrt layers read more than the mean.
      int64_t widest = plan.steps[0].chunk_tokens;
      for (int64_t i = 1; i < n; ++i) {
        const auto& prev = plan.steps[i - 1].budget;
        widest = std::max(widest, config.sink_tokens + plan.steps[i].chunk_tokens +
                                      *std::max_element(prev.begin(), prev.end()));
      }
      EXPECT_LE(plan.peak_attention_length, widest);
    } else {
      EXPECT_LE(static_cast<double>(plan.peak_attention_length), target + s + 1.0 + 1e-9);
    }
    // c_0 starts from ⌊L/n⌋ (the authors' value) plus less than n rounding tokens.
    EXPECT_GE(plan.steps[0].chunk_tokens, config.total_tokens / n - (n - 1));
    EXPECT_LT(plan.steps[0].chunk_tokens, config.total_tokens / n + n);
    EXPECT_FALSE(HasWarning(plan, "rounding remainder"));
  }

  // IMDC never attends over more keys than FM with the same flags.
  ScheduleConfig fm = config;
  fm.kind = ScheduleKind::kFixed;
  fm.growth = Growth::kLinear;
  const auto fm_plan = PlanSchedule(fm);
  SNAPFILL_ASSERT_OK(fm_plan);
  EXPECT_LE(plan.peak_attention_length, fm_plan->peak_attention_length);
  if (kind == ScheduleKind::kIncrementalDecremental) {
    EXPECT_LE(plan.peak_kv_slots, fm_plan->peak_kv_slots);
  }

  // Adaptive: the engine redistributes each step's linear total over layers;
  // simulate it with deterministic pseudo-random retention ratios.
  if (growth == Growth::kAdaptive) {
    uint64_t state = 12345;
    for (int64_t i = 1; i < n; ++i) {
      if (i > 40 && i < n - 2) continue;  // the ends and the start are enough
      std::vector<double> p(big_n);
      for (double& v : p) {
        state = state * 6364136223846793005ULL + 1442695040888963407ULL;
        v = static_cast<double>(state >> 40) / static_cast<double>(1ULL << 24);
      }
      if (i % 5 == 0) p[0] = 0;  // a layer that retained nothing
      const int64_t b = plan.steps[i].budget[0];
      const auto adaptive = AdaptiveBudgets(b, p, w, 2 * m_max);
      SNAPFILL_ASSERT_OK(adaptive);
      EXPECT_EQ(std::accumulate(adaptive->begin(), adaptive->end(), int64_t{0}), big_n * b)
          << "adaptive total must equal the linear total at step " << i;
      for (int64_t m : *adaptive) {
        EXPECT_GE(m, w);
        EXPECT_LE(m, 2 * m_max);
      }
    }
  }
}

std::string GridName(const ::testing::TestParamInfo<GridParam>& info) {
  const auto& [kind, growth, g] = info.param;
  return std::string(ScheduleKindName(kind)) + "_" + std::string(GrowthName(growth)) + "_" + g.name;
}

INSTANTIATE_TEST_SUITE_P(
    AllKinds, ScheduleGridTest,
    ::testing::Combine(::testing::Values(ScheduleKind::kFixed, ScheduleKind::kIncremental,
                                         ScheduleKind::kIncrementalDecremental),
                       ::testing::Values(Growth::kLinear, Growth::kSqrt, Growth::kSquare,
                                         Growth::kSquareSqrt, Growth::kAdaptive),
                       ::testing::ValuesIn(kGrid)),
    GridName);

// ---------------------------------------------------------------------------
// Worked examples, computed by hand.

ScheduleConfig Make(ScheduleKind kind, int64_t total, int64_t chunk, int64_t memory,
                    int64_t window = 32, int64_t layers = 1) {
  ScheduleConfig c;
  c.kind = kind;
  c.total_tokens = total;
  c.chunk = chunk;
  c.memory = memory;
  c.window = window;
  c.num_layers = layers;
  return c;
}

TEST(ScheduleExampleTest, ImLinearSmall) {
  // L = 8192, c = 2048: n = 4, m0 = 1024 / 4 = 256, m_i = 256 + 768·i/3.
  const auto plan = PlanSchedule(Make(ScheduleKind::kIncremental, 8192, 2048, 1024));
  SNAPFILL_ASSERT_OK(plan);
  EXPECT_EQ(Chunks(*plan), (std::vector<int64_t>{2048, 2048, 2048, 2048}));
  std::vector<int64_t> memory;
  for (const auto& s : plan->steps) memory.push_back(s.budget[0]);
  EXPECT_EQ(memory, (std::vector<int64_t>{256, 512, 768, 1024}));
  // Attention: c_0, then m_{i-1} + c.
  EXPECT_EQ(plan->steps[3].attention_length, 768 + 2048);
  EXPECT_DOUBLE_EQ(plan->mean_memory, 512.0);
}

TEST(ScheduleExampleTest, ImdcDivisible) {
  // Same sizes; m̂ = (256 + 512 + 768) / 3 = 512, A = c̄ + m̂ = 2560:
  // c = 2048, 2560 − 256, 2560 − 512, 2560 − 768.
  const auto plan = PlanSchedule(Make(ScheduleKind::kIncrementalDecremental, 8192, 2048, 1024));
  SNAPFILL_ASSERT_OK(plan);
  EXPECT_EQ(Chunks(*plan), (std::vector<int64_t>{2048, 2304, 2048, 1792}));
  EXPECT_EQ(plan->peak_attention_length, 2560);
  // Peak live KV (one layer): the last step's memory 768 plus its chunk.
  EXPECT_EQ(plan->peak_kv_slots, 2560);
}

TEST(ScheduleExampleTest, ImdcWithRemainder) {
  // L = 10000, c = 1024: n = 10, ⌊L/n⌋ = 1000, m0 = ⌊1024/10⌋ = 102, Δ = 922,
  // m_i = 102 + ⌊922·i/9⌋ = 102 204 306 409 511 614 716 819 921 1024.
  // Σ m_0..m_8 = 4602; A = ⌊(10000 − 1000 + 4602) / 9⌋ = ⌊13602/9⌋ = 1511
  // remainder 3, which c_0 takes (1003 <= c_1 + m_0 = 1511): c_i = 1511 − m_{i−1}.
  const auto plan = PlanSchedule(Make(ScheduleKind::kIncrementalDecremental, 10000, 1024, 1024));
  SNAPFILL_ASSERT_OK(plan);
  EXPECT_EQ(Chunks(*plan), (std::vector<int64_t>{1003, 1409, 1307, 1205, 1102, 1000, 897, 795,
                                                 692, 590}));
  std::vector<int64_t> memory;
  for (const auto& s : plan->steps) memory.push_back(s.budget[0]);
  EXPECT_EQ(memory, (std::vector<int64_t>{102, 204, 306, 409, 511, 614, 716, 819, 921, 1024}));
  EXPECT_EQ(plan->peak_attention_length, 1511);
}

TEST(ScheduleExampleTest, FixedTailMerges) {
  // 10·1024 + 20: the 20-token tail is at or below the window and joins chunk 9.
  const auto merged = PlanSchedule(Make(ScheduleKind::kFixed, 10 * 1024 + 20, 1024, 1024));
  SNAPFILL_ASSERT_OK(merged);
  ASSERT_EQ(merged->steps.size(), 10u);
  EXPECT_EQ(merged->steps.back().chunk_tokens, 1044);
  // A tail of exactly the window is merged too (no chunk may be <= w).
  const auto at_window = PlanSchedule(Make(ScheduleKind::kFixed, 10 * 1024 + 32, 1024, 1024));
  SNAPFILL_ASSERT_OK(at_window);
  EXPECT_EQ(at_window->steps.size(), 10u);
  EXPECT_EQ(at_window->steps.back().chunk_tokens, 1056);
  // L = c + 1: one chunk of c + 1.
  const auto one = PlanSchedule(Make(ScheduleKind::kIncremental, 1025, 1024, 512));
  SNAPFILL_ASSERT_OK(one);
  EXPECT_EQ(Chunks(*one), (std::vector<int64_t>{1025}));
  EXPECT_EQ(one->steps[0].budget[0], 512);
}

TEST(ScheduleExampleTest, DefaultFirstMemoryNeverBelowWindow) {
  // 1M tokens in 977 chunks: m_max / n = 1 < w, so m0 = w = 32.
  const auto plan = PlanSchedule(Make(ScheduleKind::kIncremental, 1000000, 1024, 1024));
  SNAPFILL_ASSERT_OK(plan);
  EXPECT_EQ(plan->steps.size(), 977u);
  EXPECT_EQ(plan->steps[0].budget[0], 32);
  EXPECT_EQ(plan->config.first_memory, 32);
}

TEST(ScheduleExampleTest, ExplicitFirstMemory) {
  ScheduleConfig c = Make(ScheduleKind::kIncremental, 8192, 2048, 1024);
  c.first_memory = 64;  // m_i = 64 + 960·i/3 = 64, 384, 704, 1024
  const auto plan = PlanSchedule(c);
  SNAPFILL_ASSERT_OK(plan);
  std::vector<int64_t> memory;
  for (const auto& s : plan->steps) memory.push_back(s.budget[0]);
  EXPECT_EQ(memory, (std::vector<int64_t>{64, 384, 704, 1024}));
}

TEST(ScheduleExampleTest, SquareSqrtSplitsLayers) {
  // 4 layers, n = 4, m0 = 256, Δ = 768, step 1 (x = 1/3):
  // square 256 + ⌊768/9⌋ = 341, sqrt 256 + ⌊768·0.57735⌋ = 256 + 443 = 699.
  ScheduleConfig c = Make(ScheduleKind::kIncremental, 8192, 2048, 1024, 32, 4);
  c.growth = Growth::kSquareSqrt;
  const auto plan = PlanSchedule(c);
  SNAPFILL_ASSERT_OK(plan);
  EXPECT_EQ(plan->steps[1].budget, (std::vector<int64_t>{341, 341, 699, 699}));
  // Odd count: the middle layer is linear (256 + 256 = 512).
  c.num_layers = 3;
  const auto odd = PlanSchedule(c);
  SNAPFILL_ASSERT_OK(odd);
  EXPECT_EQ(odd->steps[1].budget, (std::vector<int64_t>{341, 512, 699}));
}

TEST(ScheduleExampleTest, SquareSqrtCostsAboutAsMuchAsLinear) {
  // Paper A.1: square + sqrt integrates to twice linear, so the total memory
  // over steps and layers is close to linear's (floors make it a bit less).
  ScheduleConfig c = Make(ScheduleKind::kIncremental, 65536, 1024, 4096, 32, 8);
  const auto linear = PlanSchedule(c);
  c.growth = Growth::kSquareSqrt;
  const auto mixed = PlanSchedule(c);
  SNAPFILL_ASSERT_OK(linear);
  SNAPFILL_ASSERT_OK(mixed);
  EXPECT_NEAR(mixed->mean_memory, linear->mean_memory, 0.03 * linear->mean_memory);
}

TEST(ScheduleExampleTest, TinyChunksFallBackToOneTokenWobble) {
  // n = 2500 chunks of 40: the rounding remainder (up to n − 2 tokens) fits
  // neither in c_0 nor as one token on every later chunk, so the last chunks
  // carry one extra token each and the plan says so.
  ScheduleConfig c = Make(ScheduleKind::kIncrementalDecremental, 100000, 40, 32, 8);
  const auto plan = PlanSchedule(c);
  SNAPFILL_ASSERT_OK(plan);
  const int64_t n = static_cast<int64_t>(plan->steps.size());
  EXPECT_EQ(n, 2500);
  int64_t sum = 0;
  for (const auto& s : plan->steps) sum += s.chunk_tokens;
  EXPECT_EQ(sum, 100000);
  int64_t lo = INT64_MAX;
  int64_t hi = 0;
  for (int64_t i = 1; i < n; ++i) {
    const int64_t a = plan->steps[i].chunk_tokens + plan->steps[i - 1].budget[0];
    lo = std::min(lo, a);
    hi = std::max(hi, a);
  }
  // m0 = w = 8, m̂ ≈ 19.5, A ≈ 40 + 19.5: the remainder (hundreds of tokens)
  // exceeds c_0's room (≈ m̂) and c_0 (≈ 40) cannot give back n − 1 tokens.
  EXPECT_EQ(hi - lo, 1);
  EXPECT_LE(plan->steps[0].chunk_tokens, hi);
  EXPECT_TRUE(HasWarning(*plan, "rounding remainder"));
}

// ---------------------------------------------------------------------------
// Refusals and warnings.

void ExpectRefused(const ScheduleConfig& c, const std::string& needle) {
  const auto plan = PlanSchedule(c);
  ASSERT_FALSE(plan.ok()) << "expected a refusal mentioning '" << needle << "'";
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(plan.status().message()), HasSubstr(needle));
}

// Reads the integer after `key` in `text`, or -1.
int64_t NumberAfter(const std::string& text, const std::string& key) {
  const size_t at = text.find(key);
  if (at == std::string::npos) return -1;
  return std::stoll(text.substr(at + key.size()));
}

TEST(ScheduleRefusalTest, ImdcLargeMemoryNeedsLargerChunk) {
  // DESIGN §5: IMDC with m_max 4096 needs c above about 2100; 1024 is refused.
  ScheduleConfig c = Make(ScheduleKind::kIncrementalDecremental, 32768, 1024, 4096);
  const auto plan = PlanSchedule(c);
  ASSERT_FALSE(plan.ok());
  const std::string msg(plan.status().message());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(msg, HasSubstr("--chunk=1024"));
  EXPECT_THAT(msg, HasSubstr("--memory=4096"));
  EXPECT_THAT(msg, HasSubstr("at or below --window=32"));
  const int64_t suggested = NumberAfter(msg, "--chunk >= ");
  ASSERT_GT(suggested, 1024) << msg;
  EXPECT_GT(suggested, 1800) << msg;
  EXPECT_LT(suggested, 2400) << msg;
  // The suggestion works and one token less does not.
  c.chunk = suggested;
  SNAPFILL_EXPECT_OK(PlanSchedule(c));
  c.chunk = suggested - 1;
  EXPECT_FALSE(PlanSchedule(c).ok());
  // So does the suggested memory with the original chunk.
  c.chunk = 1024;
  const int64_t memory = NumberAfter(msg, "--memory <= ");
  ASSERT_GE(memory, 32) << msg;
  c.memory = memory;
  SNAPFILL_EXPECT_OK(PlanSchedule(c));
  c.memory = memory + 1;
  EXPECT_FALSE(PlanSchedule(c).ok());
}

TEST(ScheduleRefusalTest, ImdcSuggestionsHoldForOtherGrowths) {
  for (Growth g : {Growth::kSquare, Growth::kSquareSqrt, Growth::kSqrt}) {
    ScheduleConfig c = Make(ScheduleKind::kIncrementalDecremental, 100000, 1024, 8192, 32, 4);
    c.growth = g;
    const auto plan = PlanSchedule(c);
    ASSERT_FALSE(plan.ok()) << GrowthName(g);
    const int64_t suggested = NumberAfter(std::string(plan.status().message()), "--chunk >= ");
    ASSERT_GT(suggested, 1024) << plan.status();
    c.chunk = suggested;
    SNAPFILL_EXPECT_OK(PlanSchedule(c)) << GrowthName(g);
  }
}

TEST(ScheduleRefusalTest, ImdcEqualMemoryAndChunkWorks) {
  // DESIGN §5: m_max 1024 with c 1024 is fine, also at 1M tokens.
  SNAPFILL_EXPECT_OK(PlanSchedule(Make(ScheduleKind::kIncrementalDecremental, 32768, 1024, 1024)));
  SNAPFILL_EXPECT_OK(
      PlanSchedule(Make(ScheduleKind::kIncrementalDecremental, 1000000, 1024, 1024)));
}

// An input no longer than the window is read in one chunk and kept whole,
// whatever the schedule.
TEST(ScheduleShortInputTest, OneChunkKeptWhole) {
  for (ScheduleKind kind : {ScheduleKind::kFixed, ScheduleKind::kIncremental,
                            ScheduleKind::kIncrementalDecremental}) {
    for (int64_t total : {1, 20, 32}) {
      const auto plan = PlanSchedule(Make(kind, total, 1024, 1024, 32, 3));
      SNAPFILL_ASSERT_OK(plan);
      ASSERT_EQ(plan->steps.size(), 1u);
      EXPECT_EQ(plan->steps[0].start_token, 0);
      EXPECT_EQ(plan->steps[0].chunk_tokens, total);
      EXPECT_EQ(plan->steps[0].budget, std::vector<int64_t>(3, total));
      EXPECT_EQ(plan->max_chunk_tokens, total);
      ASSERT_EQ(plan->warnings.size(), 1u);
      EXPECT_THAT(plan->warnings[0], HasSubstr("kept whole"));
    }
  }
  // 33 tokens is longer than the window: planned as usual.
  const auto plan = PlanSchedule(Make(ScheduleKind::kFixed, 33, 1024, 1024));
  SNAPFILL_ASSERT_OK(plan);
  EXPECT_TRUE(plan->warnings.empty());
}

TEST(ScheduleRefusalTest, ImpossibleConfigs) {
  ExpectRefused(Make(ScheduleKind::kFixed, 0, 1024, 1024), "empty input");
  ExpectRefused(Make(ScheduleKind::kFixed, -5, 1024, 1024), "negative");
  // A short input is not refused for its length, but for other settings.
  ExpectRefused(Make(ScheduleKind::kIncremental, 20, 32, 1024), "--chunk=32 must be > --window=32");
  ExpectRefused(Make(ScheduleKind::kFixed, 4096, 1024, 16), "--memory=16 must be >= --window=32");
  ExpectRefused(Make(ScheduleKind::kIncremental, 4096, 32, 1024), "--chunk=32 must be > --window=32");
  ExpectRefused(Make(ScheduleKind::kIncremental, 4096, 0, 1024), "--chunk=0");
  ExpectRefused(Make(ScheduleKind::kIncremental, 4096, 1024, 1024, 0), "--window=0 must be >= 1");
  ExpectRefused(Make(ScheduleKind::kIncremental, 4096, 1024, 1024, 32, 0), "layers");

  ScheduleConfig c = Make(ScheduleKind::kIncremental, 4096, 1024, 1024);
  c.first_memory = 16;
  ExpectRefused(c, "--first_memory=16 must be >= --window=32");
  c.first_memory = 2048;
  ExpectRefused(c, "--first_memory=2048 must be <= --memory=1024");
  c.first_memory = 0;
  c.sink_tokens = 1000;  // 1000 + 32 > the first chunk of 1024
  ExpectRefused(c, "--sink_tokens=1000");
  c.sink_tokens = -1;
  ExpectRefused(c, "--sink_tokens=-1");
  // A plan far too long to hold.
  ExpectRefused(Make(ScheduleKind::kFixed, int64_t{1} << 39, 33, 64, 32, 64), "larger --chunk");
}

TEST(ScheduleRefusalTest, PositionsBeyondTheModelWarn) {
  // FM reads m_max + c = 2048 keys; a model trained on 2048 is fine, on 1536 not.
  ScheduleConfig c = Make(ScheduleKind::kFixed, 32768, 1024, 1024);
  c.max_position = 2048;
  auto plan = PlanSchedule(c);
  SNAPFILL_ASSERT_OK(plan);
  EXPECT_EQ(plan->peak_attention_length, 2048);
  EXPECT_FALSE(HasWarning(*plan, "trained context"));
  c.max_position = 1536;
  plan = PlanSchedule(c);
  SNAPFILL_ASSERT_OK(plan);  // a warning, not an error
  EXPECT_TRUE(HasWarning(*plan, "trained context of 1536"));
  // IMDC with the same flags stays within 1536 + rounding (c̄ + m̂ ≈ 1024 + 512).
  c.kind = ScheduleKind::kIncrementalDecremental;
  c.max_position = 1600;
  plan = PlanSchedule(c);
  SNAPFILL_ASSERT_OK(plan);
  EXPECT_LE(plan->peak_attention_length, 1600);
  EXPECT_FALSE(HasWarning(*plan, "trained context"));
}

TEST(ScheduleRefusalTest, FixedIgnoresGrowthWithAWarning) {
  ScheduleConfig c = Make(ScheduleKind::kFixed, 32768, 1024, 1024);
  c.growth = Growth::kSqrt;
  const auto plan = PlanSchedule(c);
  SNAPFILL_ASSERT_OK(plan);
  EXPECT_TRUE(HasWarning(*plan, "--growth=sqrt has no effect"));
}

TEST(ScheduleRefusalTest, SinksCountInAttentionAndKv) {
  ScheduleConfig c = Make(ScheduleKind::kFixed, 4096, 1024, 512, 32, 2);
  c.sink_tokens = 4;
  const auto plan = PlanSchedule(c);
  SNAPFILL_ASSERT_OK(plan);
  // Step 1 reads 4 sinks + 512 memory + 1024 chunk.
  EXPECT_EQ(plan->steps[1].attention_length, 4 + 512 + 1024);
  // While layer 1 compresses at a later step: layer 0 (512 + 4) and layer 1
  // (4 + 512 + 1024).
  EXPECT_EQ(plan->peak_kv_slots, 516 + 1540);
}

TEST(ScheduleKeepLastChunkTest, LastStepKeepsMemoryAndChunk) {
  // FM, L = 4096 + 700, c = 1024, m = 512, 2 layers, 4 sinks: chunks
  // 1024 × 4 and 700; the last step keeps 512 + 700 in each layer.
  for (const ScheduleKind kind :
       {ScheduleKind::kFixed, ScheduleKind::kIncremental, ScheduleKind::kIncrementalDecremental}) {
    ScheduleConfig c = Make(kind, 4796, 1024, 512, 32, 2);
    c.sink_tokens = 4;
    const auto base = PlanSchedule(c);
    c.keep_last_chunk = true;
    const auto kept = PlanSchedule(c);
    SNAPFILL_ASSERT_OK(base);
    SNAPFILL_ASSERT_OK(kept);
    const int64_t n = static_cast<int64_t>(base->steps.size());
    ASSERT_EQ(static_cast<int64_t>(kept->steps.size()), n) << ScheduleKindName(kind);
    ASSERT_GT(n, 1);
    // Only the last step's budgets change, by its chunk: the memory before
    // it (at most the step before's budget) and the whole chunk fit.
    for (int64_t i = 0; i + 1 < n; ++i) EXPECT_EQ(kept->steps[i].budget, base->steps[i].budget);
    const ScheduleStep& last = kept->steps.back();
    for (int64_t l = 0; l < 2; ++l) {
      EXPECT_EQ(last.budget[l], base->steps.back().budget[l] + last.chunk_tokens);
      EXPECT_GE(last.budget[l], base->steps[n - 2].budget[l] + last.chunk_tokens);
    }
    EXPECT_EQ(Chunks(*kept), Chunks(*base));
    EXPECT_EQ(kept->peak_attention_length, base->peak_attention_length);
    EXPECT_DOUBLE_EQ(kept->mean_memory, base->mean_memory);  // eq. 4's m̂: steps 0..n−2
    EXPECT_THAT(FormatPlan(*kept), HasSubstr("keeps its chunk whole"));
    EXPECT_THAT(FormatPlan(*base), ::testing::Not(HasSubstr("keeps its chunk whole")));
  }
  // FM by hand: at the last step layer 0 holds 4 + 512 + 700 and layer 1,
  // compressing, 4 + 512 + 700 as well (nothing leaves): 2432 live slots.
  ScheduleConfig c = Make(ScheduleKind::kFixed, 4796, 1024, 512, 32, 2);
  c.sink_tokens = 4;
  c.keep_last_chunk = true;
  const auto plan = PlanSchedule(c);
  SNAPFILL_ASSERT_OK(plan);
  EXPECT_EQ(plan->steps.back().chunk_tokens, 700);
  EXPECT_EQ(plan->peak_kv_slots, 2 * (4 + 512 + 700));
}

// Adaptive growth's plan keeps the tail as the others do (the engine then
// keeps each layer's memory as it is, PrefillEngineTest), with no warning.
TEST(ScheduleKeepLastChunkTest, AdaptiveKeepsTheTailToo) {
  ScheduleConfig c = Make(ScheduleKind::kIncremental, 8192, 1024, 512, 32, 2);
  c.growth = Growth::kAdaptive;
  const auto base = PlanSchedule(c);
  c.keep_last_chunk = true;
  const auto plan = PlanSchedule(c);
  SNAPFILL_ASSERT_OK(base);
  SNAPFILL_ASSERT_OK(plan);
  ASSERT_TRUE(plan->adaptive);
  std::vector<int64_t> want = base->steps.back().budget;
  for (int64_t& b : want) b += base->steps.back().chunk_tokens;
  EXPECT_EQ(plan->steps.back().budget, want);
  EXPECT_TRUE(plan->warnings.empty()) << plan->warnings.front();
  EXPECT_THAT(FormatPlan(*plan), HasSubstr("keeps its chunk whole"));
}

TEST(ScheduleKeepLastChunkTest, AnInputOfOneChunkIsKeptWhole) {
  // L = 900 <= c: one step, which would compress 900 to 512.
  ScheduleConfig one = Make(ScheduleKind::kFixed, 900, 1024, 512);
  one.keep_last_chunk = true;
  const auto single = PlanSchedule(one);
  SNAPFILL_ASSERT_OK(single);
  ASSERT_EQ(single->steps.size(), 1u);
  EXPECT_EQ(single->steps[0].budget[0], 512 + 900);
  EXPECT_EQ(single->peak_kv_slots, 900);
}

// ---------------------------------------------------------------------------
// Adaptive budgets, retention, speed-up.

TEST(AdaptiveBudgetsTest, ProportionalToRetention) {
  const std::vector<double> p = {0.1, 0.2, 0.3, 0.4};
  const auto m = AdaptiveBudgets(1000, p, 32, 0);
  SNAPFILL_ASSERT_OK(m);
  // p_j / Σp · N · b = p_j · 4000, exact here.
  EXPECT_EQ(*m, (std::vector<int64_t>{400, 800, 1200, 1600}));
  // Only proportions matter, also at the ends of the double range.
  const std::vector<double> huge = {1e300, 2e300, 3e300, 4e300};
  const auto h = AdaptiveBudgets(1000, huge, 32, 0);
  SNAPFILL_ASSERT_OK(h);
  EXPECT_EQ(*h, *m);
}

TEST(AdaptiveBudgetsTest, LargestRemainderRounding) {
  // Targets 3·1000·(1/3) = 1000 each would be exact; use 1:1:1:... with 7
  // layers and b = 100: total 700, targets 100 each; then skewed ratios.
  const std::vector<double> p = {1, 1, 1};
  const auto even = AdaptiveBudgets(100, p, 8, 0);
  SNAPFILL_ASSERT_OK(even);
  EXPECT_EQ(*even, (std::vector<int64_t>{100, 100, 100}));
  // Targets 301·(1, 1, 2)/4·... : total 3·101 = 303, shares 75.75, 75.75, 151.5:
  // floors 75, 75, 151 (301), the two largest remainders (.75, .75) get +1.
  const std::vector<double> q = {1, 1, 2};
  const auto skew = AdaptiveBudgets(101, q, 8, 0);
  SNAPFILL_ASSERT_OK(skew);
  EXPECT_EQ(*skew, (std::vector<int64_t>{76, 76, 151}));
}

TEST(AdaptiveBudgetsTest, RespectsWindowAndCap) {
  // One layer retains almost nothing: it gets the window; the others share the rest.
  const std::vector<double> p = {0.001, 1, 1, 1};
  const auto m = AdaptiveBudgets(512, p, 64, 0);
  SNAPFILL_ASSERT_OK(m);
  EXPECT_EQ((*m)[0], 64);
  EXPECT_EQ(std::accumulate(m->begin(), m->end(), int64_t{0}), 4 * 512);
  EXPECT_LE(std::max({(*m)[1], (*m)[2], (*m)[3]}) - std::min({(*m)[1], (*m)[2], (*m)[3]}), 1);
  // One layer would take almost everything: capped, the rest spread.
  const std::vector<double> q = {100, 1, 1, 1};
  const auto capped = AdaptiveBudgets(512, q, 32, 700);
  SNAPFILL_ASSERT_OK(capped);
  EXPECT_EQ((*capped)[0], 700);
  EXPECT_EQ(std::accumulate(capped->begin(), capped->end(), int64_t{0}), 4 * 512);
  for (int64_t v : *capped) {
    EXPECT_GE(v, 32);
    EXPECT_LE(v, 700);
  }
  // Cap binding on every positive layer: zero-retention layers take the rest.
  const std::vector<double> r = {1, 1, 0, 0};
  const auto zeros = AdaptiveBudgets(500, r, 32, 600);
  SNAPFILL_ASSERT_OK(zeros);
  EXPECT_EQ(*zeros, (std::vector<int64_t>{600, 600, 400, 400}));
}

TEST(AdaptiveBudgetsTest, NothingMeasuredMeansLinear) {
  const std::vector<double> p = {0, 0, 0};
  const auto m = AdaptiveBudgets(300, p, 32, 0);
  SNAPFILL_ASSERT_OK(m);
  EXPECT_EQ(*m, (std::vector<int64_t>{300, 300, 300}));
}

TEST(AdaptiveBudgetsTest, RejectsBadInput) {
  const std::vector<double> nan = {0.5, std::nan("")};
  EXPECT_EQ(AdaptiveBudgets(100, nan, 8, 0).status().code(), absl::StatusCode::kInvalidArgument);
  const std::vector<double> negative = {0.5, -0.1};
  EXPECT_FALSE(AdaptiveBudgets(100, negative, 8, 0).ok());
  const std::vector<double> ok = {0.5, 0.5};
  EXPECT_FALSE(AdaptiveBudgets(4, ok, 8, 0).ok());    // below the window
  EXPECT_FALSE(AdaptiveBudgets(100, ok, 8, 50).ok());  // cap below the budget
  EXPECT_FALSE(AdaptiveBudgets(100, std::vector<double>{}, 8, 0).ok());
}

TEST(RetentionRatioTest, CountsKeptPositions) {
  const std::vector<int64_t> prev = {0, 3, 5, 9, 12};
  const std::vector<int64_t> next = {3, 9, 14, 15};  // 3 and 9 survived: 2 of 4
  EXPECT_DOUBLE_EQ(RetentionRatio(prev, next), 0.5);
  EXPECT_DOUBLE_EQ(RetentionRatio(next, next), 1.0);
  EXPECT_DOUBLE_EQ(RetentionRatio(std::vector<int64_t>{}, next), 0.0);
  EXPECT_DOUBLE_EQ(RetentionRatio(prev, std::vector<int64_t>{}), 0.0);
}

TEST(PredictedSpeedupTest, PaperEquationFour) {
  // r = 1, c ≪ m: ideal m_max / m̂.
  EXPECT_DOUBLE_EQ(PredictedSpeedup(1.0, 4096, 2048, 0), 2.0);
  EXPECT_DOUBLE_EQ(PredictedSpeedup(0.0, 4096, 2048, 1024), 1.0);
  // r = 0.5, (1024 + 1024)/(512 + 1024) = 4/3: 0.5·(1/3) + 1.
  EXPECT_DOUBLE_EQ(PredictedSpeedup(0.5, 1024, 512, 1024), 1.0 + 0.5 / 3.0);
}

TEST(PredictedSpeedupTest, ImPlanPredictsAGain) {
  const auto plan = PlanSchedule(Make(ScheduleKind::kIncremental, 32768, 1024, 4096));
  SNAPFILL_ASSERT_OK(plan);
  EXPECT_LT(plan->mean_memory, 4096.0);
  EXPECT_GT(PredictedSpeedup(0.8, 4096, plan->mean_memory, 1024), 1.0);
}

// ---------------------------------------------------------------------------
// Printing and parsing.

int CountLines(const std::string& s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); }

TEST(FormatPlanTest, ElidesLongPlans) {
  ScheduleConfig c = Make(ScheduleKind::kIncrementalDecremental, 100000, 1024, 1024, 32, 2);
  c.max_position = 1024;  // forces a warning line
  const auto plan = PlanSchedule(c);
  SNAPFILL_ASSERT_OK(plan);
  ASSERT_EQ(plan->steps.size(), 98u);
  const std::string short_text = FormatPlan(*plan, 10);
  EXPECT_THAT(short_text, HasSubstr("schedule imdc (growth linear)"));
  EXPECT_THAT(short_text, HasSubstr("88 steps not shown"));
  EXPECT_THAT(short_text, HasSubstr("summary: 98 steps over 100000 tokens"));
  EXPECT_THAT(short_text, HasSubstr("warning: "));
  // header + column titles + 10 rows + elision + summary + 1 warning
  EXPECT_EQ(CountLines(short_text), 2 + 10 + 1 + 1 + 1);
  const std::string full = FormatPlan(*plan, 0);
  EXPECT_EQ(CountLines(full), 2 + 98 + 1 + 1);
  EXPECT_EQ(full.find("not shown"), std::string::npos);
  // The last row shows the final memory.
  EXPECT_THAT(full, HasSubstr("1024-1024"));
}

TEST(ParseTest, NamesRoundTrip) {
  for (ScheduleKind k : {ScheduleKind::kFixed, ScheduleKind::kIncremental,
                         ScheduleKind::kIncrementalDecremental}) {
    const auto parsed = ParseScheduleKind(ScheduleKindName(k));
    SNAPFILL_ASSERT_OK(parsed);
    EXPECT_EQ(*parsed, k);
  }
  for (Growth g : {Growth::kLinear, Growth::kSqrt, Growth::kSquare, Growth::kSquareSqrt,
                   Growth::kAdaptive}) {
    const auto parsed = ParseGrowth(GrowthName(g));
    SNAPFILL_ASSERT_OK(parsed);
    EXPECT_EQ(*parsed, g);
  }
  EXPECT_EQ(*ParseGrowth("square-sqrt"), Growth::kSquareSqrt);
  EXPECT_EQ(*ParseScheduleKind("incremental_decremental"), ScheduleKind::kIncrementalDecremental);
  EXPECT_EQ(ScheduleKindName(ScheduleKind::kIncrementalDecremental), "imdc");
}

TEST(ParseTest, UnknownNamesAreRefused) {
  const auto kind = ParseScheduleKind("imd");
  EXPECT_EQ(kind.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(kind.status().message()), HasSubstr("expected fm, im or imdc"));
  EXPECT_FALSE(ParseGrowth("cubic").ok());
  EXPECT_FALSE(ParseGrowth("").ok());
}

}  // namespace
}  // namespace snapfill
