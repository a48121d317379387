// Token scoring in the chunk loop (PrefillConfig::score_tokens, the loss of
// `snapfill ppl`) on a tiny random Llama: with nothing evicted every token's
// negative log-likelihood equals the one computed from a one-shot prefill's
// logits, every token but the first is scored exactly once, and each step
// scores exactly the tokens of its own chunk.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "gtest/gtest.h"
#include "snapfill/engine.h"
#include "src/model/llama_forward.h"
#include "snapfill/status.h"
#include "src/kv/kv_cache.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tiny_model.h"

namespace snapfill {
namespace {

// Relative logit agreement of chunked and one-shot prefill without eviction
// on the tiny model (prefill_engine_test.cc's NoEvictionTest bound: only the
// attention's accumulation order differs).
constexpr double kLogitRel = 2e-4;

std::unique_ptr<LlamaModel> TinyModel() {
  TinyLlamaOptions opts;
  opts.num_layers = 3;
  opts.context_length = 4096;
  return testing::LoadTinyModel(opts);
}

struct OneShotScores {
  std::vector<double> nll;  // [n - 1]: token t = 1..n-1 from position t-1
  double max_abs_logit = 0;
};

// NLL of every token from one plain prefill (LlamaForward::Forward with a
// KV cache), computed independently of the engine: logits of all positions,
// log-softmax in double.
OneShotScores OneShot(const LlamaModel& model, Backend* backend, const std::vector<int32_t>& ids) {
  const int64_t n = ids.size();
  const int64_t vocab = model.config().vocab_size;
  auto fwd = LlamaForward::Create(model, backend, n);
  SNAPFILL_CHECK(fwd.ok());
  auto kv = (*fwd)->NewKvCache(n);
  SNAPFILL_CHECK(kv.ok());
  std::vector<int32_t> pos(n);
  std::iota(pos.begin(), pos.end(), 0);
  std::vector<float> logits(n * vocab);
  SNAPFILL_CHECK((*fwd)->Forward(ids.data(), n, pos.data(), **kv, n, logits.data()).ok());
  OneShotScores s;
  for (int64_t t = 1; t < n; ++t) {
    const float* row = logits.data() + (t - 1) * vocab;
    double max = row[0];
    for (int64_t j = 0; j < vocab; ++j) {
      max = std::max<double>(max, row[j]);
      s.max_abs_logit = std::max(s.max_abs_logit, std::fabs(double(row[j])));
    }
    double sum = 0;
    for (int64_t j = 0; j < vocab; ++j) sum += std::exp(row[j] - max);
    s.nll.push_back(std::log(sum) + max - row[ids[t]]);
  }
  return s;
}

struct Scored {
  std::vector<StepTelemetry> steps;
  std::vector<double> nll;  // concatenated token_nll over the steps
  double nll_sum = 0;
  int64_t scored = 0;
};

Scored RunScored(const LlamaModel& model, Backend* backend, PrefillConfig config,
                 const std::vector<int32_t>& ids) {
  config.score_tokens = true;
  auto engine = PrefillEngine::Create(model, backend, config, ids.size());
  SNAPFILL_CHECK(engine.ok()) << engine.status();
  Scored s;
  SNAPFILL_CHECK((*engine)
                     ->Run(ids,
                           [&](const StepTelemetry& t) {
                             s.steps.push_back(t);
                             return true;
                           })
                     .ok());
  for (const StepTelemetry& t : s.steps) {
    s.nll.insert(s.nll.end(), t.token_nll.begin(), t.token_nll.end());
    s.nll_sum += t.nll_sum;
    s.scored += t.scored_tokens;
  }
  return s;
}

// Each step scores its own chunk's tokens (the input's first excepted), and
// nll_sum is the sum of token_nll.
void ExpectStepsScoreTheirChunks(const Scored& s, int64_t n) {
  ASSERT_FALSE(s.steps.empty());
  int64_t next = 0;
  for (const StepTelemetry& t : s.steps) {
    EXPECT_EQ(t.start_token, next);
    next += t.chunk_tokens;
    EXPECT_EQ(t.scored_tokens, t.chunk_tokens - (t.step == 0 ? 1 : 0)) << "step " << t.step;
    EXPECT_EQ(static_cast<int64_t>(t.token_nll.size()), t.scored_tokens);
    double sum = 0;
    for (float x : t.token_nll) {
      EXPECT_TRUE(std::isfinite(x));
      EXPECT_GE(x, 0.0f);
      sum += x;
    }
    // token_nll is float, nll_sum accumulates the doubles.
    EXPECT_NEAR(t.nll_sum, sum, 1e-6 * t.chunk_tokens * (1 + std::fabs(sum)));
  }
  EXPECT_EQ(next, n);
  EXPECT_EQ(s.scored, n - 1);
  EXPECT_EQ(static_cast<int64_t>(s.nll.size()), n - 1);
}

struct Case {
  PrunerKind pruner;
  bool original_positions;
  ScheduleKind kind;
  int64_t chunk;
  int64_t memory;  // the full pruner ignores it but plans with it
};

class ScoreEqualsOneShotTest : public ::testing::TestWithParam<Case> {};

// Without eviction the chunked prefill is one-shot prefill (prefill_engine
// _test.cc), so each token's NLL must match. log-softmax moves by at most
// 2·max|Δlogit| when the logits move (logsumexp is 1-Lipschitz in the max
// norm, plus the target's own logit), hence the per-token tolerance.
TEST_P(ScoreEqualsOneShotTest, EveryTokenOnce) {
  auto model = TinyModel();
  auto backend = CreateBackend(Device::kCpu, {});
  SNAPFILL_ASSERT_OK(backend);
  const int n = 301;  // chunks that do not divide it
  auto ids = testing::TestTokens(n, model->config().vocab_size);
  PrefillConfig config;
  config.pruner.kind = GetParam().pruner;
  config.keep_original_positions = GetParam().original_positions;
  config.schedule.kind = GetParam().kind;
  config.schedule.chunk = GetParam().chunk;
  config.schedule.memory = GetParam().memory;  // SnapKV: >= n keeps everything
  config.schedule.window = 8;
  const Scored got = RunScored(*model, backend->get(), config, ids);
  if (GetParam().chunk < n) {
    ASSERT_GT(got.steps.size(), 3u);
  }
  ExpectStepsScoreTheirChunks(got, n);
  const OneShotScores want = OneShot(*model, backend->get(), ids);
  ASSERT_EQ(got.nll.size(), want.nll.size());
  const double tol = 2 * kLogitRel * want.max_abs_logit;
  double want_sum = 0;
  for (size_t t = 0; t < want.nll.size(); ++t) {
    EXPECT_NEAR(got.nll[t], want.nll[t], tol + 1e-6 * want.nll[t]) << "token " << t + 1;
    want_sum += want.nll[t];
  }
  EXPECT_NEAR(got.nll_sum, want_sum, (n - 1) * tol);
  // The bound must be tighter than what a token scored from the wrong
  // position would miss by.
  EXPECT_LT(tol, 0.01) << "max |logit| " << want.max_abs_logit;
}

INSTANTIATE_TEST_SUITE_P(
    Pruners, ScoreEqualsOneShotTest,
    ::testing::Values(Case{PrunerKind::kFull, true, ScheduleKind::kFixed, 64, 512},
                      Case{PrunerKind::kFull, false, ScheduleKind::kFixed, 50, 512},
                      // Chunks of varying size (IMDC's plan; Full keeps all).
                      Case{PrunerKind::kFull, true, ScheduleKind::kIncrementalDecremental, 64, 24},
                      Case{PrunerKind::kSnapKv, false, ScheduleKind::kFixed, 64, 512},
                      // One chunk: every score comes from inside it.
                      Case{PrunerKind::kFull, true, ScheduleKind::kFixed, 301, 512}));

// SnapKV with a memory that holds everything keeps every candidate in order
// at the same positions as Full: the same arithmetic, so the same scores.
TEST(PrefillScoreTest, SnapKvThatKeepsEverythingEqualsFull) {
  auto model = TinyModel();
  auto backend = CreateBackend(Device::kCpu, {});
  const int n = 260;
  auto ids = testing::TestTokens(n, model->config().vocab_size);
  PrefillConfig config;
  config.schedule.kind = ScheduleKind::kFixed;
  config.schedule.chunk = 64;
  config.schedule.memory = 512;
  config.schedule.window = 8;
  config.pruner.kind = PrunerKind::kFull;
  const Scored full = RunScored(*model, backend->get(), config, ids);
  config.pruner.kind = PrunerKind::kSnapKv;
  const Scored snap = RunScored(*model, backend->get(), config, ids);
  ASSERT_EQ(full.nll.size(), snap.nll.size());
  for (size_t t = 0; t < full.nll.size(); ++t) EXPECT_EQ(full.nll[t], snap.nll[t]) << t;
  EXPECT_EQ(full.nll_sum, snap.nll_sum);
}

// With eviction the scores still cover every token once, and they change:
// the chunks after the first see a smaller memory than Full.
TEST(PrefillScoreTest, EvictionChangesScoresNotCounts) {
  auto model = TinyModel();
  auto backend = CreateBackend(Device::kCpu, {});
  const int n = 700;
  auto ids = testing::TestTokens(n, model->config().vocab_size);
  PrefillConfig config;
  config.schedule.kind = ScheduleKind::kFixed;
  config.schedule.chunk = 100;
  config.schedule.memory = 32;
  config.schedule.window = 8;
  const Scored snap = RunScored(*model, backend->get(), config, ids);
  ExpectStepsScoreTheirChunks(snap, n);
  config.pruner.kind = PrunerKind::kFull;
  const Scored full = RunScored(*model, backend->get(), config, ids);
  ExpectStepsScoreTheirChunks(full, n);
  // The first chunk's own tokens (all but its first) see no memory: equal.
  // (Token 0 is not scored; tokens 1..99 come from chunk 0's positions.)
  for (int t = 0; t < 99; ++t) EXPECT_EQ(snap.nll[t], full.nll[t]) << t;
  // Later chunks see 32 entries instead of everything before them.
  double diff = 0;
  for (int t = 100; t < n - 1; ++t) diff += std::fabs(snap.nll[t] - full.nll[t]);
  EXPECT_GT(diff, 1e-3);
}

// Stopped after step 1 and run again, the engine continues from step 2; the
// first token of that step is not scored (its predictor ran before the
// stop), every later score equals the uninterrupted run's.
TEST(PrefillScoreTest, ResumedRunScoresTheRest) {
  auto model = TinyModel();
  auto backend = CreateBackend(Device::kCpu, {});
  const int n = 400;
  auto ids = testing::TestTokens(n, model->config().vocab_size);
  PrefillConfig config;
  config.schedule.kind = ScheduleKind::kFixed;
  config.schedule.chunk = 80;
  config.schedule.memory = 48;
  config.schedule.window = 8;
  const Scored whole = RunScored(*model, backend->get(), config, ids);
  config.score_tokens = true;
  auto engine = PrefillEngine::Create(*model, backend->get(), config, n);
  SNAPFILL_ASSERT_OK(engine);
  const absl::Status stopped =
      (*engine)->Run(ids, [](const StepTelemetry& t) { return t.step < 1; });
  EXPECT_TRUE(absl::IsCancelled(stopped)) << stopped;
  ASSERT_EQ((*engine)->steps_done(), 2);
  std::vector<StepTelemetry> rest;
  SNAPFILL_ASSERT_OK((*engine)->Run(ids, [&](const StepTelemetry& t) {
    rest.push_back(t);
    return true;
  }));
  ASSERT_EQ(rest.size(), whole.steps.size() - 2);
  EXPECT_EQ(rest[0].scored_tokens, rest[0].chunk_tokens - 1);
  for (size_t i = 0; i < rest.size(); ++i) {
    const StepTelemetry& w = whole.steps[i + 2];
    const size_t skip = i == 0 ? 1 : 0;
    ASSERT_EQ(rest[i].token_nll.size() + skip, w.token_nll.size());
    for (size_t t = 0; t < rest[i].token_nll.size(); ++t) {
      EXPECT_EQ(rest[i].token_nll[t], w.token_nll[t + skip]) << "step " << w.step << " " << t;
    }
  }
}

// LlamaForward::BatchLogits, which the scoring reads a few rows at a time,
// gives the logits Forward computes for the same rows; rows outside the last
// batch are refused.
TEST(PrefillScoreTest, BatchLogitsMatchesForwardLogits) {
  auto model = TinyModel();
  auto backend = CreateBackend(Device::kCpu, {});
  const int64_t n = 40, vocab = model->config().vocab_size;
  auto ids = testing::TestTokens(n, vocab);
  auto fwd = LlamaForward::Create(*model, backend->get(), n);
  SNAPFILL_ASSERT_OK(fwd);
  auto kv = (*fwd)->NewKvCache(n);
  SNAPFILL_ASSERT_OK(kv);
  std::vector<int32_t> pos(n);
  std::iota(pos.begin(), pos.end(), 0);
  std::vector<float> want(n * vocab), got(7 * vocab);
  SNAPFILL_ASSERT_OK((*fwd)->Forward(ids.data(), n, pos.data(), **kv, n, want.data()));
  double scale = 0;
  for (float x : want) scale = std::max(scale, std::fabs(double(x)));
  for (int64_t first = 0; first < n; first += 7) {
    const int64_t rows = std::min<int64_t>(7, n - first);
    SNAPFILL_ASSERT_OK((*fwd)->BatchLogits(first, rows, got.data()));
    for (int64_t i = 0; i < rows * vocab; ++i) {
      ASSERT_NEAR(got[i], want[first * vocab + i], 1e-5 * scale) << "row " << first + i / vocab;
    }
  }
  EXPECT_TRUE(absl::IsInvalidArgument((*fwd)->BatchLogits(35, 6, got.data())));
  EXPECT_TRUE(absl::IsInvalidArgument((*fwd)->BatchLogits(-1, 1, got.data())));
  EXPECT_TRUE(absl::IsInvalidArgument((*fwd)->BatchLogits(0, 0, got.data())));
}

// Without score_tokens nothing is scored (and no logits are made).
TEST(PrefillScoreTest, OffByDefault) {
  auto model = TinyModel();
  auto backend = CreateBackend(Device::kCpu, {});
  auto ids = testing::TestTokens(200, model->config().vocab_size);
  PrefillConfig config;
  config.schedule.chunk = 64;
  config.schedule.memory = 64;
  config.schedule.window = 8;
  config.schedule.kind = ScheduleKind::kFixed;
  auto engine = PrefillEngine::Create(*model, backend->get(), config, ids.size());
  SNAPFILL_ASSERT_OK(engine);
  SNAPFILL_ASSERT_OK((*engine)->Run(ids, [](const StepTelemetry& t) {
    EXPECT_EQ(t.scored_tokens, 0);
    EXPECT_TRUE(t.token_nll.empty());
    return true;
  }));
}

}  // namespace
}  // namespace snapfill
