// Hand-computed cases for the pruners (src/compress/pruner.h): SnapKV's
// top-k, pooling, ties, window and sinks; StreamingLLM's sinks + recent;
// full; config validation and parsing. The expected sets below are derived
// by hand in the comments, not copied from the implementation.
#include "src/compress/pruner.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "snapfill/status.h"
#include "tests/testing/ref_backend.h"
#include "tests/testing/status_matchers.h"

namespace snapfill {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using Keep = std::vector<std::vector<int32_t>>;

std::unique_ptr<Pruner> MakePruner(const PrunerConfig& config) {
  auto pruner = CreatePruner(config, testing::SharedCpuBackend());
  SNAPFILL_CHECK(pruner.ok()) << pruner.status();
  return std::move(pruner).value();
}

PrunerConfig SnapKv(int64_t window, int64_t kernel, Pooling pooling = Pooling::kAvg,
                    int64_t sinks = 0) {
  PrunerConfig config;
  config.kind = PrunerKind::kSnapKv;
  config.window = window;
  config.pool_kernel = kernel;
  config.pooling = pooling;
  config.sink_tokens = sinks;
  return config;
}

// One-head input over `votes` (candidates = votes.size()).
SelectionInput OneHead(const std::vector<float>& votes, int64_t num_memory, int64_t budget,
                       const std::vector<int32_t>* positions = nullptr) {
  SelectionInput in;
  in.num_kv_heads = 1;
  in.num_candidates = static_cast<int64_t>(votes.size());
  in.num_memory = num_memory;
  in.budget = budget;
  in.votes = votes.data();
  in.votes_stride = in.num_candidates;
  if (positions != nullptr) {
    in.positions = positions->data();
    in.positions_stride = in.num_candidates;
  }
  return in;
}

// `heads` heads over n candidates (m of them memory): votes and positions
// of head h at h * votes_stride and h * positions_stride.
SelectionInput Heads(int64_t heads, int64_t n, int64_t m, int64_t budget, const std::vector<float>& votes,
                     int64_t votes_stride, const std::vector<int32_t>& positions, int64_t positions_stride) {
  SelectionInput in;
  in.num_kv_heads = heads;
  in.num_candidates = n;
  in.num_memory = m;
  in.budget = budget;
  in.votes = votes.data();
  in.votes_stride = votes_stride;
  in.positions = positions.data();
  in.positions_stride = positions_stride;
  return in;
}

// --- SnapKV -----------------------------------------------------------------

TEST(SnapKvPrunerTest, KeepsTopVotesInOrderPlusWindow) {
  // 10 chunk tokens, window 2 -> window = {8, 9}; budget 4 -> top 2 of the
  // other 8 by raw vote (kernel 1): 0.9 at 3, 0.5 at 1.
  std::vector<float> votes = {0.1f, 0.5f, 0.2f, 0.9f, 0.0f, 0.3f, 0.05f, 0.4f, 0.0f, 0.0f};
  auto pruner = MakePruner(SnapKv(2, 1));
  EXPECT_TRUE(pruner->needs_votes());
  Keep keep;
  SNAPFILL_ASSERT_OK(pruner->Select(OneHead(votes, 0, 4), &keep));
  ASSERT_EQ(keep.size(), 1u);
  EXPECT_THAT(keep[0], ElementsAre(1, 3, 8, 9));
}

TEST(SnapKvPrunerTest, TiesGoToTheLowerIndex) {
  // Rest = 0..7, votes 0.7 at 1 and 2 (tie), k = 1 -> 1.
  std::vector<float> votes = {0.5f, 0.7f, 0.7f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 9.0f, 9.0f};
  auto pruner = MakePruner(SnapKv(2, 1));
  Keep keep;
  SNAPFILL_ASSERT_OK(pruner->Select(OneHead(votes, 0, 3), &keep));
  EXPECT_THAT(keep[0], ElementsAre(1, 8, 9));
  // All equal: the lowest indices win.
  std::vector<float> flat(10, 1.0f);
  SNAPFILL_ASSERT_OK(pruner->Select(OneHead(flat, 4, 5), &keep));
  EXPECT_THAT(keep[0], ElementsAre(0, 1, 2, 8, 9));
}

TEST(SnapKvPrunerTest, AvgPoolingPrefersClusters) {
  // Rest (0..7) = [0, .9, 0, 0, .5, .6, .5, 0], window {8, 9}, k = 1.
  // Raw top is 1 (0.9); avg kernel 3: pooled[1] = 0.9/3 = 0.3,
  // pooled[5] = (0.5+0.6+0.5)/3 = 0.533 -> 5.
  std::vector<float> votes = {0, 0.9f, 0, 0, 0.5f, 0.6f, 0.5f, 0, 0, 0};
  Keep keep;
  SNAPFILL_ASSERT_OK(MakePruner(SnapKv(2, 1))->Select(OneHead(votes, 0, 3), &keep));
  EXPECT_THAT(keep[0], ElementsAre(1, 8, 9));
  SNAPFILL_ASSERT_OK(MakePruner(SnapKv(2, 3))->Select(OneHead(votes, 0, 3), &keep));
  EXPECT_THAT(keep[0], ElementsAre(5, 8, 9));
}

TEST(SnapKvPrunerTest, MaxPoolingSpreadsPeaksAndBreaksTiesLow) {
  // Same votes, max kernel 3: pooled = [.9, .9, .9, .5, .6, .6, .6, .5];
  // k = 1 -> the tie 0/1/2 goes to 0; k = 4 -> {0, 1, 2, 4}.
  std::vector<float> votes = {0, 0.9f, 0, 0, 0.5f, 0.6f, 0.5f, 0, 0, 0};
  auto pruner = MakePruner(SnapKv(2, 3, Pooling::kMax));
  Keep keep;
  SNAPFILL_ASSERT_OK(pruner->Select(OneHead(votes, 0, 3), &keep));
  EXPECT_THAT(keep[0], ElementsAre(0, 8, 9));
  SNAPFILL_ASSERT_OK(pruner->Select(OneHead(votes, 0, 6), &keep));
  EXPECT_THAT(keep[0], ElementsAre(0, 1, 2, 4, 8, 9));
}

TEST(SnapKvPrunerTest, AvgPoolingCountsPadsAsZeros) {
  // Rest = [3, 0, 0, 0, 1.2, 1.2, 1.2], window {7, 8}, kernel 3, k = 1.
  // pooled[0] = (0 + 3 + 0)/3 = 1.0 (pad counted, divided by 3),
  // pooled[5] = 1.2 -> 5. Dividing by the 2 real terms would give 1.5 -> 0.
  std::vector<float> votes = {3, 0, 0, 0, 1.2f, 1.2f, 1.2f, 0, 0};
  Keep keep;
  SNAPFILL_ASSERT_OK(MakePruner(SnapKv(2, 3))->Select(OneHead(votes, 0, 3), &keep));
  EXPECT_THAT(keep[0], ElementsAre(5, 7, 8));
}

TEST(SnapKvPrunerTest, WindowVotesDoNotLeakIntoPooling) {
  // Rest 0..7 = [0, 0, 0, 0, .3, 0, 0, 0], window {8, 9} with votes 100.
  // Pooling runs over the rest only, so pooled[7] = 0, and the tie
  // pooled[3] = pooled[4] = pooled[5] = 0.1 goes to 3.
  std::vector<float> votes = {0, 0, 0, 0, 0.3f, 0, 0, 0, 100, 100};
  Keep keep;
  SNAPFILL_ASSERT_OK(MakePruner(SnapKv(2, 3))->Select(OneHead(votes, 0, 3), &keep));
  EXPECT_THAT(keep[0], ElementsAre(3, 8, 9));
}

TEST(SnapKvPrunerTest, WindowIsTheChunkWhenTheChunkIsShorter) {
  // m = 6, c = 2, window 4 -> effective window = the 2 chunk tokens {6, 7};
  // budget 4 -> top 2 of memory: 0.8 at 2, 0.6 at 5.
  std::vector<float> votes = {0.1f, 0.2f, 0.8f, 0.3f, 0.0f, 0.6f, 0.0f, 0.0f};
  Keep keep;
  SNAPFILL_ASSERT_OK(MakePruner(SnapKv(4, 1))->Select(OneHead(votes, 6, 4), &keep));
  EXPECT_THAT(keep[0], ElementsAre(2, 5, 6, 7));
  EXPECT_EQ(EffectiveWindow(4, 2), 2);
  EXPECT_EQ(EffectiveWindow(32, 200), 32);
}

TEST(SnapKvPrunerTest, NothingEvictedWhenEverythingFits) {
  std::vector<float> votes = {0.1f, 0.9f, 0.2f, 0.0f, 0.3f};
  auto pruner = MakePruner(SnapKv(2, 7));
  Keep keep;
  for (int64_t budget : {5, 6, 100}) {
    SNAPFILL_ASSERT_OK(pruner->Select(OneHead(votes, 2, budget), &keep));
    EXPECT_THAT(keep[0], ElementsAre(0, 1, 2, 3, 4)) << "budget " << budget;
  }
  SNAPFILL_ASSERT_OK(pruner->Select(OneHead(votes, 2, 4), &keep));
  EXPECT_EQ(keep[0].size(), 4u);
}

TEST(SnapKvPrunerTest, EachHeadKeepsItsOwnSetWithTheSameCount) {
  // 2 heads x 8 candidates (stride 9), window 2 -> {6, 7}; budget 4, k = 2.
  const int64_t stride = 9;
  std::vector<float> votes = {
      0.9f, 0.1f, 0.1f, 0.1f, 0.1f, 0.8f, 0, 0, -1,  // head 0 -> {0, 5}
      0.1f, 0.1f, 0.7f, 0.9f, 0.1f, 0.1f, 0, 0, -1,  // head 1 -> {2, 3}
  };
  SelectionInput in;
  in.num_kv_heads = 2;
  in.num_candidates = 8;
  in.num_memory = 3;
  in.budget = 4;
  in.votes = votes.data();
  in.votes_stride = stride;
  Keep keep;
  SNAPFILL_ASSERT_OK(MakePruner(SnapKv(2, 1))->Select(in, &keep));
  ASSERT_EQ(keep.size(), 2u);
  EXPECT_THAT(keep[0], ElementsAre(0, 5, 6, 7));
  EXPECT_THAT(keep[1], ElementsAre(2, 3, 6, 7));
}

TEST(SnapKvPrunerTest, SinksArePinnedOutsideTheBudgetAndOutsidePooling) {
  // Memory positions [0, 1, 7], chunk positions 10..15 -> 9 candidates;
  // --sinks=2 pins candidates 0 and 1 (positions 0, 1). Window 2 -> {7, 8}.
  // Rest = candidates 2..6 with votes [.1, .2, .8, .3, .1]; budget 3 ->
  // k = 3 - 2 = 1. Avg kernel 3 over the rest only: pooled(2) = .1,
  // pooled(3) = .367, pooled(4) = .433, pooled(5) = .4 -> 4. Had the
  // sink's vote of 100 been pooled, candidate 2 would have won.
  std::vector<int32_t> positions = {0, 1, 7, 10, 11, 12, 13, 14, 15};
  std::vector<float> votes = {100, 100, 0.1f, 0.2f, 0.8f, 0.3f, 0.1f, 0, 0};
  Keep keep;
  SNAPFILL_ASSERT_OK(
      MakePruner(SnapKv(2, 3, Pooling::kAvg, 2))->Select(OneHead(votes, 3, 3, &positions), &keep));
  EXPECT_THAT(keep[0], ElementsAre(0, 1, 4, 7, 8));  // budget 3 + 2 sinks

  // Sinks never compete: even with the lowest votes they stay.
  std::vector<float> low_sinks = {-5, -5, 0.1f, 0.2f, 0.8f, 0.3f, 0.1f, 0, 0};
  SNAPFILL_ASSERT_OK(MakePruner(SnapKv(2, 1, Pooling::kAvg, 2))
                         ->Select(OneHead(low_sinks, 3, 3, &positions), &keep));
  EXPECT_THAT(keep[0], ElementsAre(0, 1, 4, 7, 8));

  // Identity is decided on the non-sink candidates: 7 of them fit budget 7.
  SNAPFILL_ASSERT_OK(
      MakePruner(SnapKv(2, 3, Pooling::kAvg, 2))->Select(OneHead(votes, 3, 7, &positions), &keep));
  EXPECT_EQ(keep[0].size(), 9u);

  // A sink inside the window (a first chunk shorter than the sinks + the
  // window): the non-sinks all lie in the window and fit, nothing evicted.
  std::vector<int32_t> first_chunk = {0, 1, 2, 3, 4, 5};
  std::vector<float> six = {0, 0, 0, 0, 0, 0};
  SNAPFILL_ASSERT_OK(
      MakePruner(SnapKv(5, 3, Pooling::kAvg, 2))->Select(OneHead(six, 0, 5, &first_chunk), &keep));
  EXPECT_THAT(keep[0], ElementsAre(0, 1, 2, 3, 4, 5));
}

TEST(SnapKvPrunerTest, RefusesBadInput) {
  std::vector<float> votes(10, 1.0f);
  auto pruner = MakePruner(SnapKv(4, 1));
  Keep keep;
  // Budget below the window.
  absl::Status s = pruner->Select(OneHead(votes, 0, 3), &keep);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("window"));
  // Missing votes.
  SelectionInput in = OneHead(votes, 0, 5);
  in.votes = nullptr;
  EXPECT_EQ(pruner->Select(in, &keep).code(), absl::StatusCode::kInvalidArgument);
  // Votes stride shorter than the candidates.
  in = OneHead(votes, 0, 5);
  in.votes_stride = 9;
  EXPECT_EQ(pruner->Select(in, &keep).code(), absl::StatusCode::kInvalidArgument);
  // More memory than candidates.
  in = OneHead(votes, 11, 5);
  EXPECT_EQ(pruner->Select(in, &keep).code(), absl::StatusCode::kInvalidArgument);
  // No heads.
  in = OneHead(votes, 0, 5);
  in.num_kv_heads = 0;
  EXPECT_EQ(pruner->Select(in, &keep).code(), absl::StatusCode::kInvalidArgument);
  // Sinks without positions.
  EXPECT_EQ(MakePruner(SnapKv(4, 1, Pooling::kAvg, 4))->Select(OneHead(votes, 0, 5), &keep).code(),
            absl::StatusCode::kInvalidArgument);
  // A NaN vote is a broken invariant upstream.
  std::vector<float> nan_votes(10, 1.0f);
  nan_votes[2] = std::numeric_limits<float>::quiet_NaN();
  s = pruner->Select(OneHead(nan_votes, 0, 5), &keep);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(s.message()), HasSubstr("candidate 2"));
}

TEST(SnapKvPrunerTest, RefusesSinksThatDifferAcrossHeads) {
  // Head 0 holds position 1 (a sink for --sinks=2), head 1 does not.
  std::vector<int32_t> positions = {0, 1, 5, 6, 7, 8, 9, 10,  //
                                    0, 4, 5, 6, 7, 8, 9, 10};
  std::vector<float> votes(16, 1.0f);
  SelectionInput in;
  in.num_kv_heads = 2;
  in.num_candidates = 8;
  in.num_memory = 3;
  in.budget = 4;
  in.votes = votes.data();
  in.votes_stride = 8;
  in.positions = positions.data();
  in.positions_stride = 8;
  Keep keep;
  absl::Status s = MakePruner(SnapKv(2, 1, Pooling::kAvg, 2))->Select(in, &keep);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("KV head 1 has 1"));
}

// Random inputs: the output is ascending, the same size in every head
// (budget + sinks), holds the window and the sinks, and is the same on a
// second call (scratch reuse must not leak state).
TEST(SnapKvPrunerTest, RandomInvariants) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> unif(0.0f, 1.0f);
  for (int trial = 0; trial < 50; ++trial) {
    const int64_t heads = 1 + trial % 4, m = trial % 3 == 0 ? 0 : 3 + trial, c = 9 + trial % 11;
    const int64_t window = 1 + trial % 8, sinks = trial % 2 == 0 ? 0 : 1 + trial % 4;
    const int64_t n = m + c;
    const int64_t budget = window + trial % 13;
    std::vector<float> votes(heads * (n + 3)), window_votes(heads * (n + 3));
    for (float& v : votes) v = std::floor(unif(rng) * 8) / 8;
    for (float& v : window_votes) v = std::floor(unif(rng) * 4) / 4;  // many ties
    std::vector<int32_t> positions(heads * (n + 1));
    for (int64_t h = 0; h < heads; ++h) {
      // Memory: the sinks, then increasing positions; chunk after them.
      for (int64_t j = 0; j < n; ++j) positions[h * (n + 1) + j] = static_cast<int32_t>(j * 2);
    }
    const SelectionInput in = Heads(heads, n, m, budget, votes, n + 3, positions, n + 1);
    auto pruner = MakePruner(
        SnapKv(window, 1 + 2 * (trial % 4), trial % 5 == 0 ? Pooling::kMax : Pooling::kAvg, sinks));
    Keep keep, again;
    SNAPFILL_ASSERT_OK(pruner->Select(in, &keep));
    SNAPFILL_ASSERT_OK(pruner->Select(in, &again));
    EXPECT_EQ(keep, again);
    int64_t num_sinks = 0;
    for (int64_t j = 0; j < n; ++j) num_sinks += positions[j] < sinks;
    const int64_t expected = n - num_sinks <= budget ? n : budget + num_sinks;
    const int64_t w = std::min(window, c);
    ASSERT_EQ(keep.size(), static_cast<size_t>(heads));
    for (int64_t h = 0; h < heads; ++h) {
      const auto& k = keep[h];
      ASSERT_EQ(static_cast<int64_t>(k.size()), expected) << "trial " << trial << " head " << h;
      for (size_t i = 1; i < k.size(); ++i) ASSERT_LT(k[i - 1], k[i]);
      for (int64_t j = 0; j < num_sinks; ++j) EXPECT_EQ(k[j], j);
      for (int64_t j = 0; j < w; ++j) EXPECT_EQ(k[k.size() - w + j], n - w + j);
    }
  }
}

// PlanInBackend: where SnapKV's rule is one Backend::SelectHeads, that op
// keeps exactly what Select keeps (random inputs with many ties, sinks,
// both poolings, memories and chunks of every size; the window's votes,
// or a question's alone as single tokens or spans, each head's or their
// sum, at the last step or before it; a question leaving the window's
// votes a share, which pick after it; the stored scores of gate and
// reconstruct, in spans of --score_span); and it declines what is not
// one: nothing to evict, streaming and full.
TEST(SnapKvPrunerTest, TheBackendOpKeepsWhatSelectKeeps) {
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> unif(0.0f, 1.0f);
  int planned = 0, asked = 0, summed_heads = 0, shared_out = 0, both_picked = 0, stored = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t heads = 1 + trial % 4, m = trial % 3 == 0 ? 0 : 3 + trial, c = 9 + trial % 11;
    const int64_t window = 1 + trial % 8, sinks = trial % 2 == 0 ? 0 : 1 + trial % 4;
    const int64_t n = m + c, budget = window + trial % 13;
    std::vector<float> votes(heads * (n + 3)), window_votes(heads * (n + 3));
    for (float& v : votes) v = std::floor(unif(rng) * 8) / 8;
    for (float& v : window_votes) v = std::floor(unif(rng) * 4) / 4;
    std::vector<int32_t> positions(heads * (n + 1));
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t j = 0; j < n; ++j) positions[h * (n + 1) + j] = static_cast<int32_t>(j * 2);
    }
    SelectionInput in = Heads(heads, n, m, budget, votes, n + 3, positions, n + 1);
    PrunerConfig config = SnapKv(window, 1 + 2 * (trial % 4), trial % 5 == 0 ? Pooling::kMax : Pooling::kAvg, sinks);
    // Two trials of three: a question's votes (the same values) pick
    // alone, spans of 3 or 8, or single tokens; at the last step or not.
    const bool question = trial % 3 != 0;
    // Some of them with the heads' votes summed, which the op reads as one
    // row (the engine sums them in head order, as Select does).
    const bool shared = question && trial % 7 < 2 && heads > 1;
    std::vector<float> summed(n, 0.0f);
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t j = 0; j < n; ++j) summed[j] += votes[h * (n + 3) + j];
    }
    // Half of the others rank stored scores (the same rule over them, in
    // spans of 1 to 5).
    const bool stored_scores = !question && trial % 2 == 1;
    if (stored_scores) {
      config.kind = trial % 4 == 1 ? PrunerKind::kGate : PrunerKind::kReconstruct;
      config.score_span = 1 + trial % 5;
    }
    if (question) {
      config.query_select = trial % 4 == 1 ? Selection::kToken : Selection::kSpan;
      config.span = trial % 2 == 0 ? 3 : 8;
      config.shared_query_votes = shared;
      in.query_votes = votes.data();
      in.query_votes_stride = n + 3;
      in.votes = nullptr;  // (not read with the question's whole share)
      in.final_step = trial % 5 < 2;
      // Some leave the window's votes a share (none, or 30%, 60%, 90%).
      if (trial % 11 < 4) {
        config.query_share = 0.3 * (trial % 11);
        in.votes = window_votes.data();
        in.votes_stride = n + 3;
      }
    }
    auto pruner = MakePruner(config);
    Keep keep;
    SNAPFILL_ASSERT_OK(pruner->Select(in, &keep));
    Backend::HeadSelection op;
    SelectionInput without_votes = in;
    without_votes.votes = nullptr;  // (not read)
    if (!pruner->PlanInBackend(without_votes, &op)) {
      EXPECT_EQ(static_cast<int64_t>(keep[0].size()), n) << "trial " << trial << ": declined, yet evicting";
      continue;
    }
    ++planned;
    asked += question;
    stored += stored_scores;
    summed_heads += shared;
    op.votes = shared ? summed.data() : votes.data();
    op.votes_stride = shared ? 0 : n + 3;
    if (op.then_pick > 0) {
      op.then_votes = window_votes.data();
      op.then_votes_stride = n + 3;
    }
    shared_out += question && config.query_share < 1.0;
    both_picked += op.pick > 0 && op.then_pick > 0;
    op.keep_stride = op.count() + 1;
    std::vector<int32_t> rows(heads * op.keep_stride);
    op.keep = rows.data();
    SNAPFILL_ASSERT_OK(testing::SharedCpuBackend().SelectHeads(op));
    for (int64_t h = 0; h < heads; ++h) {
      const int32_t* row = rows.data() + h * op.keep_stride;
      EXPECT_EQ(std::vector<int32_t>(row, row + op.count()), keep[h]) << "trial " << trial << " head " << h;
      EXPECT_EQ(row[op.count()], -1);
    }
  }
  EXPECT_GT(planned, 150);
  EXPECT_GT(asked, 100);
  EXPECT_GT(summed_heads, 20);
  EXPECT_GT(shared_out, 40);
  EXPECT_GT(both_picked, 20);
  EXPECT_GT(stored, 20);

  // What the op is told, and declined inputs.
  const std::vector<float> votes(20, 0.5f);
  std::vector<int32_t> positions(20);
  std::iota(positions.begin(), positions.end(), 0);
  Backend::HeadSelection op;
  EXPECT_TRUE(MakePruner(SnapKv(4, 3))->PlanInBackend(OneHead(votes, 10, 8), &op));
  EXPECT_EQ(op.count(), 8);
  EXPECT_EQ(op.span, 1);
  EXPECT_FALSE(MakePruner(SnapKv(4, 3))->PlanInBackend(OneHead(votes, 10, 20), &op)) << "nothing evicted";
  // A question (the defaults: its votes alone, spans of 32): no window
  // before the last step, the whole window at it.
  SelectionInput question = OneHead(votes, 10, 8);
  question.query_votes = votes.data();
  question.query_votes_stride = 20;
  EXPECT_TRUE(MakePruner(SnapKv(4, 3))->PlanInBackend(question, &op));
  EXPECT_EQ(op.window_begin, 20);
  EXPECT_EQ(op.pick, 8);
  EXPECT_EQ(op.span, 32);
  question.final_step = true;
  EXPECT_TRUE(MakePruner(SnapKv(4, 3))->PlanInBackend(question, &op));
  EXPECT_EQ(op.window_begin, 16);
  EXPECT_EQ(op.pick, 4);
  // Half the share: at the last step the whole window, R's 4 split 2 and
  // 2; before it half the window (2), R's 6 split 3 and 3.
  PrunerConfig shares = SnapKv(4, 3);
  shares.query_share = 0.5;
  EXPECT_TRUE(MakePruner(shares)->PlanInBackend(question, &op));
  EXPECT_EQ(op.window_begin, 16);
  EXPECT_EQ(op.pick, 2);
  EXPECT_EQ(op.then_pick, 2);
  question.final_step = false;
  EXPECT_TRUE(MakePruner(shares)->PlanInBackend(question, &op));
  EXPECT_EQ(op.window_begin, 18);
  EXPECT_EQ(op.pick, 3);
  EXPECT_EQ(op.then_pick, 3);
  EXPECT_EQ(op.count(), 8);
  question.final_step = true;
  PrunerConfig shared = SnapKv(4, 3);
  shared.shared_query_votes = true;
  SelectionInput two_heads = question;
  two_heads.num_kv_heads = 2;
  EXPECT_TRUE(MakePruner(shared)->PlanInBackend(two_heads, &op)) << "the heads' votes summed";
  // Stored scores are picked in spans of --score_span.
  for (const PrunerKind kind : {PrunerKind::kGate, PrunerKind::kReconstruct}) {
    PrunerConfig config = SnapKv(4, 3);
    config.kind = kind;
    config.score_span = 5;
    auto made = CreatePruner(config, testing::SharedCpuBackend());
    SNAPFILL_ASSERT_OK(made.status());
    EXPECT_TRUE((*made)->PlanInBackend(OneHead(votes, 10, 8), &op)) << PrunerKindName(kind);
    EXPECT_EQ(op.count(), 8);
    EXPECT_EQ(op.span, 5);
  }
  for (const PrunerKind kind : {PrunerKind::kStreaming, PrunerKind::kFull}) {
    PrunerConfig config = SnapKv(4, 3);
    config.kind = kind;
    auto made = CreatePruner(config, testing::SharedCpuBackend());
    SNAPFILL_ASSERT_OK(made.status());
    EXPECT_FALSE((*made)->PlanInBackend(OneHead(votes, 10, 8), &op)) << PrunerKindName(kind);
  }
}

// At the engine's sizes the heads are selected on all threads, each with
// scratch of its own: every head gets what it gets when selected alone
// (one head, on the calling thread), with and without sinks, call after
// call; and a bad vote in one head is reported for that head.
TEST(SnapKvPrunerTest, ManyHeadsAtOnceAsEachAlone) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> unif(0.0f, 1.0f);
  const int64_t heads = 5, m = 1024, c = 1030, n = m + c, budget = 1024;
  for (const int64_t sinks : {0, 4}) {
    for (int call = 0; call < 2; ++call) {
      std::vector<float> votes(heads * (n + 5));
      for (float& v : votes) v = std::floor(unif(rng) * 64) / 64;  // ties
      std::vector<int32_t> positions(heads * n);
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t j = 0; j < n; ++j) positions[h * n + j] = static_cast<int32_t>(j);
      }
      const SelectionInput in = Heads(heads, n, m, budget, votes, n + 5, positions, n);
      auto pruner = MakePruner(SnapKv(32, 7, Pooling::kAvg, sinks));
      Keep keep;
      SNAPFILL_ASSERT_OK(pruner->Select(in, &keep));
      ASSERT_EQ(keep.size(), static_cast<size_t>(heads));
      for (int64_t h = 0; h < heads; ++h) {
        const std::vector<float> head_votes(votes.begin() + h * (n + 5), votes.begin() + h * (n + 5) + n);
        const std::vector<int32_t> head_positions(positions.begin() + h * n, positions.begin() + (h + 1) * n);
        Keep alone;
        SNAPFILL_ASSERT_OK(MakePruner(SnapKv(32, 7, Pooling::kAvg, sinks))
                               ->Select(OneHead(head_votes, m, budget, &head_positions), &alone));
        EXPECT_EQ(keep[h], alone[0]) << "head " << h << " sinks " << sinks << " call " << call;
        EXPECT_EQ(static_cast<int64_t>(keep[h].size()), budget + sinks);
      }
      votes[3 * (n + 5) + 17] = std::numeric_limits<float>::infinity();
      const absl::Status s = pruner->Select(in, &keep);
      EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
      EXPECT_THAT(std::string(s.message()), HasSubstr("KV head 3 candidate 17"));
    }
  }
}

// --- SnapKV guided by a question -------------------------------------------

PrunerConfig Guided(int64_t window, int64_t kernel, double share, Selection select, int64_t span = 4,
                    int64_t sinks = 0) {
  PrunerConfig config = SnapKv(window, kernel, Pooling::kAvg, sinks);
  config.query_share = share;
  config.query_select = select;
  config.span = span;
  return config;
}

TEST(GuidedSnapKvTest, TheQuestionPicksItsTopTokensThenTheWindowTheRest) {
  // The input's last step: 12 chunk tokens, window 2 -> window {10, 11}
  // kept; budget 6 -> k = 4 of R = 0..9 (kernel 1). Share 0.5 -> the
  // question picks 2: its votes peak at 7 (0.9) and 2 (0.8). The window
  // picks 2 of the rest: its own votes peak at 7 (taken), then 4 (0.6) and
  // 0 (0.5).
  std::vector<float> window_votes = {0.5f, 0.1f, 0.0f, 0.2f, 0.6f, 0.1f, 0.0f, 0.9f, 0.3f, 0.0f, 0, 0};
  std::vector<float> query_votes = {0.0f, 0.1f, 0.8f, 0.0f, 0.0f, 0.2f, 0.0f, 0.9f, 0.0f, 0.3f, 0, 0};
  SelectionInput in = OneHead(window_votes, 0, 6);
  in.query_votes = query_votes.data();
  in.query_votes_stride = in.num_candidates;
  in.final_step = true;
  Keep keep;
  SNAPFILL_ASSERT_OK(MakePruner(Guided(2, 1, 0.5, Selection::kToken))->Select(in, &keep));
  EXPECT_THAT(keep[0], ElementsAre(0, 2, 4, 7, 10, 11));
  // An earlier step pins only the window's share of it: round(0.5 * 2) = 1,
  // {11}; k = 5 of R = 0..10, round(2.5) = 3 by the question (7, 2, 9),
  // 2 by the window (4, 0).
  in.final_step = false;
  SNAPFILL_ASSERT_OK(MakePruner(Guided(2, 1, 0.5, Selection::kToken))->Select(in, &keep));
  EXPECT_THAT(keep[0], ElementsAre(0, 2, 4, 7, 9, 11));
  // Share 1 needs no window votes. At the last step the question picks 4
  // (7, 2, 9, 5) beside the window; before it, all 6 of R = 0..11: 7, 2, 9,
  // 5, 1, then the lowest index of the zero votes, 0.
  in.votes = nullptr;
  in.final_step = true;
  SNAPFILL_ASSERT_OK(MakePruner(Guided(2, 1, 1.0, Selection::kToken))->Select(in, &keep));
  EXPECT_THAT(keep[0], ElementsAre(2, 5, 7, 9, 10, 11));
  in.final_step = false;
  SNAPFILL_ASSERT_OK(MakePruner(Guided(2, 1, 1.0, Selection::kToken))->Select(in, &keep));
  EXPECT_THAT(keep[0], ElementsAre(0, 1, 2, 5, 7, 9));
  // Share below 1 reads the window's votes: none given is an error.
  EXPECT_EQ(MakePruner(Guided(2, 1, 0.5, Selection::kToken))->Select(in, &keep).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(GuidedSnapKvTest, SpansKeepTheNeighboursOfTheStrongestVotes) {
  // R = 0..29 (window 2 of 32), k = 10, span 4 (2 each side). The question's
  // votes peak at 20 (1.0) and 5 (0.5): the span around 20 takes 20, 19, 21,
  // 18, 22; the one around 5 takes 5, 4, 6, 3, 7. Token selection would
  // take 20, 5 and then the first eight zero-vote entries 0, 1, 2, ...
  std::vector<float> query_votes(32, 0.0f);
  query_votes[20] = 1.0f;
  query_votes[5] = 0.5f;
  std::vector<float> window_votes(32, 0.0f);
  SelectionInput in = OneHead(window_votes, 0, 12);
  in.query_votes = query_votes.data();
  in.query_votes_stride = 32;
  in.final_step = true;  // the window {30, 31} kept
  Keep keep;
  SNAPFILL_ASSERT_OK(MakePruner(Guided(2, 1, 1.0, Selection::kSpan, 4))->Select(in, &keep));
  EXPECT_THAT(keep[0], ElementsAre(3, 4, 5, 6, 7, 18, 19, 20, 21, 22, 30, 31));
  SNAPFILL_ASSERT_OK(MakePruner(Guided(2, 1, 1.0, Selection::kToken, 4))->Select(in, &keep));
  EXPECT_THAT(keep[0], ElementsAre(0, 1, 2, 3, 4, 5, 6, 7, 8, 20, 30, 31));
  // Spans stop at R's ends and skip what is taken: the peak at 0 takes 0,
  // 1, 2; the peak at 1 is taken already, so the next (3, the first zero
  // vote left) takes the last slot (k = 4).
  std::fill(query_votes.begin(), query_votes.end(), 0.0f);
  query_votes[0] = 1.0f;
  query_votes[1] = 0.9f;
  in.budget = 6;
  SNAPFILL_ASSERT_OK(MakePruner(Guided(2, 1, 1.0, Selection::kSpan, 4))->Select(in, &keep));
  EXPECT_THAT(keep[0], ElementsAre(0, 1, 2, 3, 30, 31));
}

// The pruners that rank by stored scores (gate, reconstruct) take SnapKV's
// selection over them with the window kept, by token (--score_span 1) or as
// spans around the highest scores.
TEST(StoredScoresPrunerTest, WindowThenTokensOrSpans) {
  // 32 chunk candidates, window 2 -> {30, 31}; budget 12 -> k = 10 of
  // R = 0..29 (kernel 1). Scores peak at 20 (1.0) and 5 (0.5), the rest a
  // little above zero falling with the index.
  std::vector<float> scores(32);
  for (int i = 0; i < 32; ++i) scores[i] = 0.01f * (32 - i) / 32;
  scores[20] = 1.0f;
  scores[5] = 0.5f;
  for (PrunerKind kind : {PrunerKind::kGate, PrunerKind::kReconstruct}) {
    PrunerConfig config = SnapKv(2, 1);
    config.kind = kind;
    config.score_span = 1;
    auto pruner = MakePruner(config);
    EXPECT_EQ(pruner->kind(), kind);
    Keep keep;
    // Tokens: 20, 5, then the eight highest of the rest, 0..4 and 6..8.
    SNAPFILL_ASSERT_OK(pruner->Select(OneHead(scores, 0, 12), &keep));
    EXPECT_THAT(keep[0], ElementsAre(0, 1, 2, 3, 4, 5, 6, 7, 8, 20, 30, 31));
    // Spans of 4: 20 and its two neighbours each side, then 5's.
    config.score_span = 4;
    SNAPFILL_ASSERT_OK(MakePruner(config)->Select(OneHead(scores, 0, 12), &keep));
    EXPECT_THAT(keep[0], ElementsAre(3, 4, 5, 6, 7, 18, 19, 20, 21, 22, 30, 31));
  }
}

// Shared question votes: what one head's question queries found, every
// head keeps.
TEST(GuidedSnapKvTest, SharedVotesKeepWhatAnyHeadFound) {
  // Two heads over 12 candidates, window 2 kept (last step), k = 2 of
  // R = 0..9, by token. Head 0's question votes peak at 3 (0.9) and 6
  // (0.2); head 1's at 8 (0.8) and 1 (0.3). Summed: 3 (0.9), 8 (0.8).
  const int64_t n = 12;
  std::vector<float> votes(2 * n, 0.0f), query(2 * n, 0.0f);
  query[3] = 0.9f;
  query[6] = 0.2f;
  query[n + 8] = 0.8f;
  query[n + 1] = 0.3f;
  std::vector<int32_t> positions(2 * n);
  std::iota(positions.begin(), positions.begin() + n, 0);
  std::iota(positions.begin() + n, positions.end(), 0);
  SelectionInput in = Heads(2, n, 0, 4, votes, n, positions, n);
  in.query_votes = query.data();
  in.query_votes_stride = n;
  in.final_step = true;
  PrunerConfig config = Guided(2, 1, 1.0, Selection::kToken);
  config.shared_query_votes = true;
  Keep keep;
  SNAPFILL_ASSERT_OK(MakePruner(config)->Select(in, &keep));
  EXPECT_THAT(keep[0], ElementsAre(3, 8, 10, 11));
  EXPECT_THAT(keep[1], ElementsAre(3, 8, 10, 11));
  config.shared_query_votes = false;
  SNAPFILL_ASSERT_OK(MakePruner(config)->Select(in, &keep));
  EXPECT_THAT(keep[0], ElementsAre(3, 6, 10, 11));
  EXPECT_THAT(keep[1], ElementsAre(1, 8, 10, 11));
}

// A question with no share selects as SnapKV alone, bit for bit, whatever
// its votes; and any share keeps the counts, order, sinks and window.
TEST(GuidedSnapKvTest, NoShareIsSnapKvAndEveryShareKeepsTheInvariants) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> unif(0.0f, 1.0f);
  for (int trial = 0; trial < 60; ++trial) {
    const int64_t heads = 1 + trial % 3, m = trial % 3 == 0 ? 0 : 5 + trial, c = 12 + trial % 9;
    const int64_t window = 1 + trial % 6, sinks = trial % 2 == 0 ? 0 : 1 + trial % 3;
    const int64_t n = m + c, budget = window + trial % 17;
    std::vector<float> votes(heads * n), query(heads * (n + 5));
    for (float& v : votes) v = std::floor(unif(rng) * 8) / 8;
    for (float& v : query) v = std::floor(unif(rng) * 8) / 8;
    std::vector<int32_t> positions(heads * n);
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t j = 0; j < n; ++j) positions[h * n + j] = static_cast<int32_t>(j * 3);
    }
    SelectionInput plain = Heads(heads, n, m, budget, votes, n, positions, n);
    SelectionInput guided = plain;
    guided.query_votes = query.data();
    guided.query_votes_stride = n + 5;
    const int64_t kernel = 1 + 2 * (trial % 3);
    Keep want, got;
    SNAPFILL_ASSERT_OK(MakePruner(SnapKv(window, kernel, Pooling::kAvg, sinks))->Select(plain, &want));
    for (Selection select : {Selection::kToken, Selection::kSpan}) {
      SNAPFILL_ASSERT_OK(MakePruner(Guided(window, kernel, 0.0, select, 5, sinks))->Select(guided, &got));
      EXPECT_EQ(got, want) << "trial " << trial;
      for (double share : {0.3, 1.0}) {
        SNAPFILL_ASSERT_OK(MakePruner(Guided(window, kernel, share, select, 5, sinks))->Select(guided, &got));
        ASSERT_EQ(got.size(), want.size());
        for (int64_t h = 0; h < heads; ++h) {
          ASSERT_EQ(got[h].size(), want[h].size()) << "trial " << trial << " share " << share;
          for (size_t i = 1; i < got[h].size(); ++i) ASSERT_LT(got[h][i - 1], got[h][i]);
          // Sinks and the window's share of the window, as SnapKV keeps them.
          const int64_t pinned = std::llround((1.0 - share) * std::min(window, c));
          for (size_t i = 0; i < want[h].size(); ++i) {
            const int32_t j = want[h][i];
            if (positions[j] < sinks || j >= n - pinned) {
              EXPECT_NE(std::find(got[h].begin(), got[h].end(), j), got[h].end()) << j;
            }
          }
        }
      }
    }
  }
}

TEST(GuidedSnapKvTest, ConfigurationIsCheckedAndNamed) {
  PrunerConfig config;
  config.query_share = 1.5;
  EXPECT_THAT(std::string(ValidatePrunerConfig(config).message()), HasSubstr("--query_share=1.5"));
  config.query_share = std::nan("");
  EXPECT_EQ(ValidatePrunerConfig(config).code(), absl::StatusCode::kInvalidArgument);
  config = PrunerConfig{};
  config.span = 0;
  EXPECT_THAT(std::string(ValidatePrunerConfig(config).message()), HasSubstr("--span=0"));
  for (Selection select : {Selection::kToken, Selection::kSpan}) {
    auto parsed = ParseSelection(SelectionName(select));
    SNAPFILL_ASSERT_OK(parsed);
    EXPECT_EQ(*parsed, select);
  }
  EXPECT_THAT(std::string(ParseSelection("sentence").status().message()), HasSubstr("--select=sentence"));
  for (QueryVotes votes : {QueryVotes::kSum, QueryVotes::kMax}) {
    auto parsed = ParseQueryVotes(QueryVotesName(votes));
    SNAPFILL_ASSERT_OK(parsed);
    EXPECT_EQ(*parsed, votes);
  }
  EXPECT_THAT(std::string(ParseQueryVotes("mean").status().message()), HasSubstr("--query_votes=mean"));
  // The question's votes must cover the candidates.
  std::vector<float> votes(8, 0.1f), query(8, 0.2f);
  SelectionInput in = OneHead(votes, 0, 4);
  in.query_votes = query.data();
  in.query_votes_stride = 7;
  Keep keep;
  EXPECT_EQ(MakePruner(Guided(2, 1, 1.0, Selection::kToken))->Select(in, &keep).code(),
            absl::StatusCode::kInvalidArgument);
  in.query_votes_stride = 8;
  query[3] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(MakePruner(Guided(2, 1, 1.0, Selection::kToken))->Select(in, &keep).code(),
            absl::StatusCode::kInternal);
}

// --- StreamingLLM -------------------------------------------------------------

PrunerConfig Streaming(int64_t sinks) {
  PrunerConfig config;
  config.kind = PrunerKind::kStreaming;
  config.sink_tokens = sinks;
  return config;
}

SelectionInput NoVotes(int64_t heads, int64_t n, int64_t m, int64_t budget,
                       const std::vector<int32_t>* positions = nullptr) {
  SelectionInput in;
  in.num_kv_heads = heads;
  in.num_candidates = n;
  in.num_memory = m;
  in.budget = budget;
  if (positions != nullptr) {
    in.positions = positions->data();
    in.positions_stride = n;
  }
  return in;
}

TEST(StreamingPrunerTest, KeepsTheMostRecent) {
  auto pruner = MakePruner(Streaming(0));
  EXPECT_FALSE(pruner->needs_votes());
  Keep keep;
  SNAPFILL_ASSERT_OK(pruner->Select(NoVotes(2, 10, 4, 4), &keep));
  ASSERT_EQ(keep.size(), 2u);
  EXPECT_THAT(keep[0], ElementsAre(6, 7, 8, 9));
  EXPECT_THAT(keep[1], ElementsAre(6, 7, 8, 9));
}

TEST(StreamingPrunerTest, KeepsSinksInsideTheBudget) {
  // Memory positions [0, 1, 5, 6], chunk 7..12; --sinks=2, budget 4 ->
  // the 2 sinks + the 2 most recent.
  std::vector<int32_t> positions = {0, 1, 5, 6, 7, 8, 9, 10, 11, 12};
  Keep keep;
  SNAPFILL_ASSERT_OK(MakePruner(Streaming(2))->Select(NoVotes(1, 10, 4, 4, &positions), &keep));
  EXPECT_THAT(keep[0], ElementsAre(0, 1, 8, 9));
  // Budget equal to the sinks: only the sinks.
  SNAPFILL_ASSERT_OK(MakePruner(Streaming(2))->Select(NoVotes(1, 10, 4, 2, &positions), &keep));
  EXPECT_THAT(keep[0], ElementsAre(0, 1));
  // Sinks that do not fit.
  // --sinks=6 pins positions 0, 1 and 5: three entries.
  EXPECT_EQ(MakePruner(Streaming(6))->Select(NoVotes(1, 10, 4, 2, &positions), &keep).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(StreamingPrunerTest, NothingEvictedWhenEverythingFits) {
  Keep keep;
  SNAPFILL_ASSERT_OK(MakePruner(Streaming(0))->Select(NoVotes(1, 5, 0, 5), &keep));
  EXPECT_THAT(keep[0], ElementsAre(0, 1, 2, 3, 4));
}

// --- Full -------------------------------------------------------------------

TEST(FullPrunerTest, KeepsEverythingWhateverTheBudget) {
  PrunerConfig config;
  config.kind = PrunerKind::kFull;
  config.sink_tokens = 4;
  auto pruner = MakePruner(config);
  EXPECT_FALSE(pruner->needs_votes());
  Keep keep;
  SNAPFILL_ASSERT_OK(pruner->Select(NoVotes(3, 7, 2, 1), &keep));
  ASSERT_EQ(keep.size(), 3u);
  for (const auto& head : keep) EXPECT_THAT(head, ElementsAre(0, 1, 2, 3, 4, 5, 6));
}

// --- Config -----------------------------------------------------------------

TEST(PrunerConfigTest, ValidationNamesTheFlag) {
  SNAPFILL_EXPECT_OK(ValidatePrunerConfig(PrunerConfig{}));
  PrunerConfig config;
  config.window = 0;
  absl::Status s = ValidatePrunerConfig(config);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("--window=0"));

  config = PrunerConfig{};
  config.pool_kernel = 4;
  s = ValidatePrunerConfig(config);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("--pool_kernel=4"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("odd"));
  config.pool_kernel = 0;
  EXPECT_THAT(std::string(ValidatePrunerConfig(config).message()), HasSubstr("--pool_kernel"));
  config.pool_kernel = 1;
  SNAPFILL_EXPECT_OK(ValidatePrunerConfig(config));

  config = PrunerConfig{};
  config.sink_tokens = -1;
  s = ValidatePrunerConfig(config);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("--sinks=-1"));
  EXPECT_EQ(CreatePruner(config, testing::SharedCpuBackend()).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(PrunerConfigTest, BudgetChecksAndCapacity) {
  PrunerConfig config = SnapKv(32, 7, Pooling::kAvg, 4);
  absl::Status s = ValidatePrunerBudget(config, 16);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("--window=32"));
  SNAPFILL_EXPECT_OK(ValidatePrunerBudget(config, 32));
  EXPECT_EQ(KeptCapacity(config, 100), 104);

  config = Streaming(4);
  EXPECT_EQ(ValidatePrunerBudget(config, 3).code(), absl::StatusCode::kInvalidArgument);
  SNAPFILL_EXPECT_OK(ValidatePrunerBudget(config, 4));
  EXPECT_EQ(KeptCapacity(config, 100), 100);
}

TEST(PrunerConfigTest, ParsesNamesAndRoundTrips) {
  for (PrunerKind kind : {PrunerKind::kSnapKv, PrunerKind::kStreaming, PrunerKind::kFull}) {
    auto parsed = ParsePrunerKind(PrunerKindName(kind));
    SNAPFILL_ASSERT_OK(parsed);
    EXPECT_EQ(*parsed, kind);
    PrunerConfig config;
    config.kind = kind;
    auto pruner = CreatePruner(config, testing::SharedCpuBackend());
    SNAPFILL_ASSERT_OK(pruner);
    EXPECT_EQ((*pruner)->kind(), kind);
  }
  EXPECT_STREQ(PrunerKindName(PrunerKind::kSnapKv), "snapkv");
  EXPECT_EQ(ParsePrunerKind("h2o").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(ParsePrunerKind("h2o").status().message()), HasSubstr("h2o"));
  for (Pooling pooling : {Pooling::kAvg, Pooling::kMax}) {
    auto parsed = ParsePooling(PoolingName(pooling));
    SNAPFILL_ASSERT_OK(parsed);
    EXPECT_EQ(*parsed, pooling);
  }
  EXPECT_EQ(ParsePooling("mean").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace snapfill
