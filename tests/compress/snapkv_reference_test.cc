// SnapKV selection against a plain double-precision reference written here
// from DESIGN.md §3 (it calls no kernel): window votes from softmax(q·kᵀ/√d)
// of the chunk's last w queries over the keys each may see, summed over the
// window, averaged over the query heads of each KV group (kv-major
// grouping); 1-D pooling over the non-window, non-sink candidates; per-head
// top (budget − w) with ties to the lower index; + the window; sinks pinned
// outside the budget.
//
// The engine's path is cpu::WindowScores (f32) followed by the SnapKV
// pruner. The kept sets must be equal; where they differ, both positions'
// reference pooled scores must lie within a derived tolerance of the k-th
// (threshold) score, since f32 rounding may swap near-ties (STYLE.md §6).
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/ops.h"
#include "snapfill/status.h"
#include "src/compress/pruner.h"
#include "tests/testing/ref_backend.h"
#include "tests/testing/status_matchers.h"

namespace snapfill {
namespace {

struct Case {
  int64_t num_heads;
  int64_t num_kv_heads;
  int64_t head_dim;
  int64_t m;  // memory entries
  int64_t c;  // chunk tokens
  int64_t w;  // --window
};

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  const Case& p = info.param;
  std::ostringstream os;
  os << "heads" << p.num_heads << "_kv" << p.num_kv_heads << "_d" << p.head_dim << "_m" << p.m
     << "_c" << p.c << "_w" << p.w;
  return os.str();
}

// The reference's answer for one KV head, plus what the tolerance needs.
struct RefSelection {
  std::vector<int32_t> keep;   // ascending
  std::vector<double> pooled;  // [num_candidates], pooled score of R's members (else 0)
  double threshold = 0;        // k-th highest pooled score in R (if evicting)
  bool evicts = false;
};

// DESIGN.md §3 steps 3-5 and 7 for one head, in double.
RefSelection ReferenceSelect(const std::vector<double>& votes, const std::vector<int32_t>& pos,
                             int64_t num_memory, int64_t window, int64_t budget, int64_t kernel,
                             bool max_pool, int64_t sinks) {
  const int64_t n = static_cast<int64_t>(votes.size());
  const int64_t w = std::min(window, n - num_memory);
  RefSelection out;
  out.pooled.assign(n, 0.0);
  std::vector<bool> is_sink(n);
  int64_t num_sinks = 0;
  for (int64_t j = 0; j < n; ++j) num_sinks += is_sink[j] = pos[j] < sinks;
  if (n - num_sinks <= budget) {
    for (int64_t j = 0; j < n; ++j) out.keep.push_back(static_cast<int32_t>(j));
    return out;
  }
  out.evicts = true;
  // R: the non-window non-sinks, in candidate order.
  std::vector<int64_t> rest;
  int64_t window_non_sinks = 0;
  for (int64_t j = 0; j < n; ++j) {
    if (is_sink[j]) continue;
    if (j >= n - w) {
      ++window_non_sinks;
    } else {
      rest.push_back(j);
    }
  }
  const int64_t r = static_cast<int64_t>(rest.size());
  const int64_t half = kernel / 2;
  std::vector<double> pooled(r);
  for (int64_t i = 0; i < r; ++i) {
    double acc = max_pool ? -INFINITY : 0.0;
    for (int64_t t = i - half; t <= i + half; ++t) {
      if (t < 0 || t >= r) continue;  // pad: zero for avg, ignored for max
      const double v = votes[rest[t]];
      acc = max_pool ? std::max(acc, v) : acc + v;
    }
    pooled[i] = max_pool ? acc : acc / static_cast<double>(kernel);
    out.pooled[rest[i]] = pooled[i];
  }
  const int64_t k = budget - window_non_sinks;
  std::vector<int64_t> order(r);
  for (int64_t i = 0; i < r; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return pooled[a] > pooled[b] || (pooled[a] == pooled[b] && a < b);
  });
  std::vector<bool> take(n, false);
  for (int64_t j = 0; j < n; ++j) take[j] = is_sink[j] || j >= n - w;
  for (int64_t i = 0; i < k; ++i) take[rest[order[i]]] = true;
  out.threshold = k > 0 ? pooled[order[k - 1]] : pooled[order[0]];
  for (int64_t j = 0; j < n; ++j) {
    if (take[j]) out.keep.push_back(static_cast<int32_t>(j));
  }
  return out;
}

class SnapKvReferenceTest : public ::testing::TestWithParam<Case> {};

TEST_P(SnapKvReferenceTest, MatchesDoubleReference) {
  const Case p = GetParam();
  const int64_t n = p.m + p.c;
  const int64_t d = p.head_dim;
  const int64_t group = p.num_heads / p.num_kv_heads;
  const int64_t w = std::min(p.w, p.c);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  std::mt19937 rng(static_cast<uint32_t>(1000 * p.num_heads + 100 * p.m + 10 * p.c + p.w));
  std::normal_distribution<float> normal(0.0f, 1.0f);

  // Q: [c, num_heads, d], token stride padded by 5 floats.
  const int64_t q_stride = p.num_heads * d + 5;
  std::vector<float> q(p.c * q_stride);
  for (float& x : q) x = 1.5f * normal(rng);
  // K: head-major [num_kv_heads][n][d], head stride padded by 3 keys.
  const int64_t key_stride = d;
  const int64_t head_stride = (n + 3) * d;
  std::vector<float> k(p.num_kv_heads * head_stride);
  for (float& x : k) x = normal(rng);
  // A few "heavy" keys per head aligned with one query head, so that the
  // votes are peaked as in real models rather than nearly flat.
  for (int64_t h = 0; h < p.num_kv_heads; ++h) {
    for (int rep = 0; rep < 3; ++rep) {
      const int64_t j = static_cast<int64_t>(rng() % static_cast<uint32_t>(n));
      const float* qrow = q.data() + (p.c - 1) * q_stride + (h * group) * d;
      for (int64_t e = 0; e < d; ++e) k[h * head_stride + j * key_stride + e] += 0.5f * qrow[e];
    }
  }

  // Reference votes, in double: ref_votes[h][j].
  std::vector<std::vector<double>> ref_votes(p.num_kv_heads, std::vector<double>(n, 0.0));
  double max_abs_logit_terms = 0.0;  // max scale·Σ|q||k|, for the tolerance
  for (int64_t qh = 0; qh < p.num_heads; ++qh) {
    const int64_t kvh = qh / group;  // kv-major grouping
    for (int64_t i = 0; i < w; ++i) {
      const int64_t t = p.c - w + i;  // chunk query index
      const int64_t visible = p.m + t + 1;
      const float* qv = q.data() + t * q_stride + qh * d;
      std::vector<double> logits(visible);
      double mx = -INFINITY;
      for (int64_t j = 0; j < visible; ++j) {
        const float* kv = k.data() + kvh * head_stride + j * key_stride;
        double dot = 0.0, abs_dot = 0.0;
        for (int64_t e = 0; e < d; ++e) {
          dot += static_cast<double>(qv[e]) * kv[e];
          abs_dot += std::fabs(static_cast<double>(qv[e]) * kv[e]);
        }
        logits[j] = dot * scale;
        max_abs_logit_terms = std::max(max_abs_logit_terms, abs_dot * scale);
        mx = std::max(mx, logits[j]);
      }
      double sum = 0.0;
      for (int64_t j = 0; j < visible; ++j) sum += std::exp(logits[j] - mx);
      for (int64_t j = 0; j < visible; ++j) {
        ref_votes[kvh][j] += std::exp(logits[j] - mx) / sum / static_cast<double>(group);
      }
    }
  }

  // Engine path: f32 window votes from the window queries only.
  const int64_t votes_stride = n + 5;
  std::vector<float> votes(p.num_kv_heads * votes_stride, -7.0f);
  cpu::WindowScores(q.data() + (p.c - w) * q_stride, q_stride, k.data(), head_stride, key_stride,
                    votes.data(), votes_stride, w, n, p.num_heads, p.num_kv_heads, d,
                    static_cast<float>(scale));

  // Derived f32 error bound, relative to a vote (STYLE.md §6): logits are
  // d-term dot products, |err| <= d·eps·S with S = max scale·Σ|q||k|; the
  // max subtraction doubles it; exp adds ~2 eps; the softmax sum of up to n
  // terms adds n·eps; normalizing twice the exp error; the sum over w·group
  // window terms adds w·group·eps. Pooling adds kernel·eps.
  const double eps = FLT_EPSILON;
  const double logit_err = 2.0 * d * eps * max_abs_logit_terms;
  const double rel_vote = 2.0 * (logit_err + 2 * eps) + (n + 4) * eps + w * group * eps;
  for (int64_t h = 0; h < p.num_kv_heads; ++h) {
    for (int64_t j = 0; j < n; ++j) {
      const double ref = ref_votes[h][j];
      ASSERT_NEAR(votes[h * votes_stride + j], ref, rel_vote * ref + 1e-30)
          << "vote of KV head " << h << " candidate " << j;
    }
  }

  // Positions: with sinks, every head's memory holds the sinks 0..3 then
  // its own increasing subset of earlier tokens; the chunk follows.
  const int64_t chunk_start = p.m == 0 ? 0 : 4 * p.m + 10;
  const int64_t positions_stride = n + 2;
  std::vector<int32_t> positions(p.num_kv_heads * positions_stride, -1);
  for (int64_t h = 0; h < p.num_kv_heads; ++h) {
    int32_t* row = positions.data() + h * positions_stride;
    std::vector<int32_t> pool;
    for (int32_t x = 4; x < chunk_start; ++x) pool.push_back(x);
    std::shuffle(pool.begin(), pool.end(), rng);
    std::vector<int32_t> mem;
    for (int64_t j = 0; j < p.m; ++j) {
      mem.push_back(j < 4 ? static_cast<int32_t>(j) : pool[j - 4]);
    }
    std::sort(mem.begin(), mem.end());
    for (int64_t j = 0; j < p.m; ++j) row[j] = mem[j];
    for (int64_t t = 0; t < p.c; ++t) row[p.m + t] = static_cast<int32_t>(chunk_start + t);
  }

  std::vector<int64_t> budgets = {w, w + (n - w) / 3, n - 5, n - 1, n, n + 7};
  int64_t swaps = 0, selections = 0;
  for (int64_t sinks : {0, 4}) {
    for (int64_t budget : budgets) {
      if (budget < w) continue;
      for (int64_t kernel : {1, 3, 7}) {
        for (bool max_pool : {false, true}) {
          if (kernel == 1 && max_pool) continue;
          PrunerConfig config;
          config.window = p.w;
          config.pool_kernel = kernel;
          config.pooling = max_pool ? Pooling::kMax : Pooling::kAvg;
          config.sink_tokens = sinks;
          auto pruner = CreatePruner(config, testing::SharedCpuBackend());
          SNAPFILL_ASSERT_OK(pruner);
          SelectionInput in;
          in.num_kv_heads = p.num_kv_heads;
          in.num_candidates = n;
          in.num_memory = p.m;
          in.budget = budget;
          in.votes = votes.data();
          in.votes_stride = votes_stride;
          in.positions = positions.data();
          in.positions_stride = positions_stride;
          std::vector<std::vector<int32_t>> keep;
          SNAPFILL_ASSERT_OK((*pruner)->Select(in, &keep));
          ASSERT_EQ(keep.size(), static_cast<size_t>(p.num_kv_heads));
          ++selections;

          const double rel = 2.0 * (rel_vote + (kernel + 1) * eps);
          for (int64_t h = 0; h < p.num_kv_heads; ++h) {
            std::ostringstream ctx;
            ctx << "KV head " << h << " budget " << budget << " kernel " << kernel
                << (max_pool ? " max" : " avg") << " sinks " << sinks;
            const std::vector<int32_t> pos(positions.begin() + h * positions_stride,
                                           positions.begin() + h * positions_stride + n);
            const RefSelection ref =
                ReferenceSelect(ref_votes[h], pos, p.m, p.w, budget, kernel, max_pool, sinks);
            const std::vector<int32_t>& got = keep[h];
            ASSERT_EQ(got.size(), ref.keep.size()) << ctx.str();
            ASSERT_TRUE(std::is_sorted(got.begin(), got.end())) << ctx.str();
            if (!ref.evicts) {
              EXPECT_EQ(got, ref.keep) << ctx.str() << ": budget covers everything (identity)";
              continue;
            }
            std::vector<int32_t> diff;
            std::set_symmetric_difference(got.begin(), got.end(), ref.keep.begin(), ref.keep.end(),
                                          std::back_inserter(diff));
            const double tol = rel * ref.threshold;
            for (int32_t j : diff) {
              // Window and sinks are never in play; only R's near-ties may swap.
              ASSERT_LT(j, n - w) << ctx.str() << ": window candidate " << j << " differs";
              ASSERT_GE(pos[j], sinks) << ctx.str() << ": sink candidate " << j << " differs";
              EXPECT_LE(std::fabs(ref.pooled[j] - ref.threshold), tol)
                  << ctx.str() << ": candidate " << j << " pooled " << ref.pooled[j]
                  << " vs threshold " << ref.threshold << " (tol " << tol << ", " << diff.size()
                  << " differing)";
            }
            swaps += static_cast<int64_t>(diff.size()) / 2;
          }
        }
      }
    }
  }
  EXPECT_GT(selections, 0);
  RecordProperty("near_tie_swaps", static_cast<int>(swaps));
}

std::vector<Case> AllCases() {
  // GQA ratios 1, 3 (SmolLM2-135M: 9 heads, 3 KV heads, head_dim 64), 4.
  const Case heads[] = {{4, 4, 16, 0, 0, 0}, {9, 3, 64, 0, 0, 0}, {8, 2, 32, 0, 0, 0}};
  std::vector<Case> cases;
  for (const Case& h : heads) {
    for (int64_t m : {0, 5, 100}) {
      for (int64_t c : {33, 64, 200}) {
        for (int64_t w : {1, 8, 32}) {
          cases.push_back({h.num_heads, h.num_kv_heads, h.head_dim, m, c, w});
        }
      }
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Cpu, SnapKvReferenceTest, ::testing::ValuesIn(AllCases()), CaseName);

// A chunk shorter than --window: the window is the whole chunk.
TEST(SnapKvReferenceShortChunkTest, WindowIsTheChunk) {
  const int64_t m = 20, c = 6, n = m + c;
  std::vector<double> ref(n);
  std::vector<float> votes(n);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> unif(0.0f, 1.0f);
  for (int64_t j = 0; j < n; ++j) ref[j] = votes[j] = unif(rng);
  std::vector<int32_t> pos(n);
  for (int64_t j = 0; j < n; ++j) pos[j] = static_cast<int32_t>(3 * j);
  PrunerConfig config;
  config.window = 32;
  config.pool_kernel = 3;
  auto pruner = CreatePruner(config, testing::SharedCpuBackend());
  SNAPFILL_ASSERT_OK(pruner);
  SelectionInput in;
  in.num_kv_heads = 1;
  in.num_candidates = n;
  in.num_memory = m;
  in.budget = 10;
  in.votes = votes.data();
  in.votes_stride = n;
  std::vector<std::vector<int32_t>> keep;
  SNAPFILL_ASSERT_OK((*pruner)->Select(in, &keep));
  const RefSelection expected = ReferenceSelect(ref, pos, m, 32, 10, 3, false, 0);
  EXPECT_EQ(keep[0], expected.keep);
  EXPECT_EQ(keep[0].size(), 10u);
  for (int64_t t = 0; t < c; ++t) EXPECT_EQ(keep[0][10 - c + t], m + t);
}

}  // namespace
}  // namespace snapfill
