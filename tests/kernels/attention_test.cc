// Tests of cpu::Attention and cpu::WindowScores against their double
// precision twins in kernels/ref, plus invariants (decode ≡ last prefill
// row, votes sum to the window, strides and padding untouched).
//
// Tolerance derivation (eps = 2^-23, f32 unit roundoff 2^-24 per op):
//  * A score s_j = scale·q·k_j is an f32 dot over d terms (q pre-scaled, one
//    more rounding): |Δs_j| <= (d + 2)·eps·A, A = max_j scale·Σ_t|q_t k_jt|.
//  * p_j = exp(s_j - m)/l: an error Δs in the exponent is a relative error
//    Δs in p_j (plus the same through m and l), exp adds ~2 ulp, and the f32
//    row sum l of K terms with online rescaling adds <= (K + 8)·eps relative.
//    So every p_j is off by at most ε = eps·(2(d + 2)·A + K + 8) relative.
//  * out_d = Σ_j p_j v_jd, accumulated in f32 over K terms (+K·eps):
//    |Δout_d| <= 2·eps·(2(d + 2)·A + K + 8)·Σ_j p_j|v_jd|   (factor 2: margin).
//  * votes_j = (1/G)Σ_rows p_rj: all terms positive, f32 sum over M rows:
//    |Δvotes_j| <= 2·eps·(2(d + 2)·A + K + M + 8)·votes_j.
// These worst-case bounds grow with K; the whole tensor must also reach
// NMSE <= 1e-7 (ggml test-backend-ops' f32 default).
#include <bit>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <omp.h>

#include "gtest/gtest.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/thread_team.h"
#include "kernels/quant_blocks.h"
#include "kernels/ref/ops_ref.h"

namespace snapfill {
namespace {

constexpr double kEps = std::numeric_limits<float>::epsilon();
constexpr double kMaxNmse = 1e-7;

// Problem geometry with deliberately awkward strides: every buffer starts one
// float past an aligned address, tokens and keys are padded, and each KV head
// has a capacity larger than num_keys.
struct AttnCase {
  int64_t num_q;
  int64_t num_keys;
  int64_t num_heads;
  int64_t num_kv_heads;
  int64_t head_dim;
  float scale_mult = 1.0f;  // scale = scale_mult / sqrt(head_dim)
  int64_t window = 0;       // > 0: a sliding window (query i sees its last `window` keys)
};

// The first key query i of num_q sees (0 without a window).
int64_t FirstVisible(const AttnCase& c, int64_t i) {
  const int64_t end = c.num_keys - c.num_q + i + 1;
  return c.window > 0 ? std::max<int64_t>(0, end - c.window) : 0;
}

struct AttnData {
  AttnCase c;
  int64_t q_stride, out_stride, kv_key_stride, kv_head_stride;
  float scale;
  std::vector<float> q, k, v;  // buffers; data starts at index 1
  const float* Q() const { return q.data() + 1; }
  const float* K() const { return k.data() + 1; }
  const float* Vv() const { return v.data() + 1; }
};

AttnData MakeData(const AttnCase& c, uint32_t seed) {
  AttnData a;
  a.c = c;
  a.q_stride = c.num_heads * c.head_dim + 3;
  a.out_stride = c.num_heads * c.head_dim + 5;
  a.kv_key_stride = c.head_dim + 1;
  a.kv_head_stride = (c.num_keys + 2) * a.kv_key_stride;
  a.scale = c.scale_mult / std::sqrt(static_cast<float>(c.head_dim));
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  auto fill = [&](std::vector<float>& buf, int64_t n) {
    buf.resize(1 + n);
    for (float& x : buf) x = dist(rng);
  };
  fill(a.q, c.num_q * a.q_stride);
  fill(a.k, c.num_kv_heads * a.kv_head_stride);
  fill(a.v, c.num_kv_heads * a.kv_head_stride);
  return a;
}

::testing::AssertionResult Report(const std::vector<float>& got, const std::vector<double>& want,
                                  const std::vector<double>& tol) {
  int64_t bad = 0, worst = -1;
  double worst_ratio = 0.0, err2 = 0.0, ref2 = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(got[i] - want[i]);
    err2 += err * err;
    ref2 += want[i] * want[i];
    if (!(err <= tol[i])) {
      ++bad;
      if (!(err / tol[i] <= worst_ratio)) {
        worst_ratio = err / tol[i];
        worst = static_cast<int64_t>(i);
      }
    }
  }
  const double nmse = ref2 > 0.0 ? err2 / ref2 : err2;
  if (bad == 0 && nmse <= kMaxNmse) return ::testing::AssertionSuccess();
  auto fail = ::testing::AssertionFailure();
  fail << "NMSE " << nmse << " (limit " << kMaxNmse << "); " << bad << " of " << got.size()
       << " outside tolerance";
  if (worst >= 0) {
    fail << "; worst index " << worst << ": expected " << want[worst] << ", actual " << got[worst]
         << ", tolerance " << tol[worst];
  }
  return fail;
}

// Per-element bound of the header comment for out[i][h][d]: index
// (i * num_heads + h) * head_dim + d.
std::vector<double> AttentionBound(const AttnData& a) {
  const AttnCase& c = a.c;
  const int64_t group = c.num_heads / c.num_kv_heads;
  std::vector<double> bound(c.num_q * c.num_heads * c.head_dim);
  std::vector<double> s, abs_dot;
  for (int64_t i = 0; i < c.num_q; ++i) {
    const int64_t first = FirstVisible(c, i);
    const int64_t visible = c.num_keys - c.num_q + i + 1 - first;
    for (int64_t h = 0; h < c.num_heads; ++h) {
      const float* qh = a.Q() + i * a.q_stride + h * c.head_dim;
      const float* kh = a.K() + (h / group) * a.kv_head_stride + first * a.kv_key_stride;
      const float* vh = a.Vv() + (h / group) * a.kv_head_stride + first * a.kv_key_stride;
      s.assign(visible, 0.0);
      double amax = 0.0, smax = -1e300;
      for (int64_t j = 0; j < visible; ++j) {
        double dot = 0.0, absd = 0.0;
        for (int64_t t = 0; t < c.head_dim; ++t) {
          dot += static_cast<double>(qh[t]) * kh[j * a.kv_key_stride + t];
          absd += std::abs(static_cast<double>(qh[t]) * kh[j * a.kv_key_stride + t]);
        }
        s[j] = dot * a.scale;
        amax = std::max(amax, absd * a.scale);
        smax = std::max(smax, s[j]);
      }
      double l = 0.0;
      for (double& x : s) l += (x = std::exp(x - smax));
      const double rel = 2.0 * kEps * (2.0 * (c.head_dim + 2) * amax + visible + 8);
      for (int64_t t = 0; t < c.head_dim; ++t) {
        double mag = 0.0;
        for (int64_t j = 0; j < visible; ++j)
          mag += s[j] / l * std::abs(vh[j * a.kv_key_stride + t]);
        bound[(i * c.num_heads + h) * c.head_dim + t] = rel * mag + 1e-30;
      }
    }
  }
  return bound;
}

// Runs cpu::Attention into a padded output filled with a sentinel; checks the
// padding is untouched and returns the dense [num_q][num_heads][head_dim].
// With lse, the queries' log-denominators into it ([num_heads][num_q]).
std::vector<float> RunCpuAttention(const AttnData& a, int64_t q_offset_rows = 0, int64_t num_q = -1,
                                   float* lse = nullptr) {
  const AttnCase& c = a.c;
  if (num_q < 0) num_q = c.num_q;
  const float kSentinel = 12345.0f;
  std::vector<float> out(1 + num_q * a.out_stride, kSentinel);
  cpu::Attention(a.Q() + q_offset_rows * a.q_stride, a.q_stride, a.K(), a.Vv(), a.kv_head_stride, a.kv_key_stride,
                 out.data() + 1, a.out_stride, num_q, c.num_keys, c.num_heads, c.num_kv_heads, c.head_dim, a.scale,
                 c.window, lse);
  std::vector<float> dense;
  dense.reserve(num_q * c.num_heads * c.head_dim);
  EXPECT_EQ(out[0], kSentinel) << "wrote before the output";
  for (int64_t i = 0; i < num_q; ++i) {
    for (int64_t t = 0; t < a.out_stride; ++t) {
      const float x = out[1 + i * a.out_stride + t];
      if (t < c.num_heads * c.head_dim) {
        dense.push_back(x);
      } else {
        EXPECT_EQ(x, kSentinel) << "wrote into the padding of token " << i;
      }
    }
  }
  return dense;
}

std::vector<double> RunRefAttention(const AttnData& a) {
  const AttnCase& c = a.c;
  std::vector<float> out(c.num_q * a.out_stride);
  ref::Attention(a.Q(), a.q_stride, a.K(), a.Vv(), a.kv_head_stride, a.kv_key_stride, out.data(),
                 a.out_stride, c.num_q, c.num_keys, c.num_heads, c.num_kv_heads, c.head_dim,
                 a.scale, c.window);
  std::vector<double> dense;
  for (int64_t i = 0; i < c.num_q; ++i) {
    for (int64_t t = 0; t < c.num_heads * c.head_dim; ++t)
      dense.push_back(out[i * a.out_stride + t]);
  }
  return dense;
}

std::string CaseName(const AttnCase& c) {
  return "Cpu_q" + std::to_string(c.num_q) + "_keys" + std::to_string(c.num_keys) + "_heads" +
         std::to_string(c.num_heads) + "_kv" + std::to_string(c.num_kv_heads) + "_hd" +
         std::to_string(c.head_dim) + (c.scale_mult != 1.0f ? "_peaky" : "") +
         (c.window > 0 ? "_window" + std::to_string(c.window) : "");
}

// The sweep of the brief: num_q × memory before the chunk × GQA ratio, with
// head_dim cycling through awkward and real values.
std::vector<AttnCase> SweepCases() {
  std::vector<AttnCase> cases;
  const int64_t head_dims[] = {64, 17, 80, 16, 96, 128, 33};
  int idx = 0;
  for (int64_t num_q : {1, 7, 64, 130}) {
    for (int64_t memory : {0, 1, 300}) {
      for (int64_t ratio : {1, 3, 4}) {
        const int64_t kv = ratio == 1 ? 2 : 1;
        cases.push_back({num_q, num_q + memory, kv * ratio, kv, head_dims[idx++ % 7]});
      }
    }
  }
  // Real models: SmolLM2-135M (9 heads, 3 KV, d 64), Llama-3-8B (32, 8, 128).
  cases.push_back({64, 364, 9, 3, 64});
  cases.push_back({16, 316, 32, 8, 128});
  // Odd and large head dims, a peaky softmax (scores spread ~ ±30).
  cases.push_back({5, 70, 4, 2, 256});
  cases.push_back({3, 3, 2, 1, 1});
  // Multi-query: 32 heads on one KV head (2 queries per item), and 71 heads
  // (more score rows than one micro-tile: several row chunks per item).
  cases.push_back({9, 50, 32, 1, 64});
  cases.push_back({9, 50, 71, 1, 24});
  cases.push_back({33, 200, 6, 2, 64, 6.0f});
  // Decoding over long caches: the key range is split across items and the
  // partial softmaxes merged (SmolLM2's heads, odd sizes, a peaky softmax,
  // and more items than keys per range).
  cases.push_back({1, 1000, 9, 3, 64});
  cases.push_back({1, 4099, 9, 3, 64});
  cases.push_back({1, 2500, 8, 1, 17});
  cases.push_back({1, 3000, 4, 4, 64, 6.0f});
  cases.push_back({1, 513, 2, 2, 33});
  // Two query heads per KV head at head_dim 64 (the values of a group's heads
  // in one pass, as for 1, 3 and 4 above).
  cases.push_back({1, 700, 8, 4, 64});
  // More query heads per KV head than run together at once (in chunks): 8
  // (TinyLlama's 32 on 4) and 5 (a chunk and a remainder at either width).
  cases.push_back({1, 900, 32, 4, 64});
  cases.push_back({1, 600, 10, 2, 64});
  // Decoding at head_dim 128 over many keys (Llama-3-8B's heads): the score
  // blocks of the heads together (up to 4 at AVX2), and groups of 3 and 5
  // (4 heads and 1).
  cases.push_back({1, 1155, 32, 8, 128});
  cases.push_back({1, 500, 6, 2, 128});
  cases.push_back({1, 301, 5, 1, 128});
  // An odd count of KV heads over 512-1,023 keys: two ranges per head (a
  // range each left one thread of two a range more); SmolLM2's 1,000 above.
  cases.push_back({1, 640, 6, 1, 64});
  // Decoding at head_dim 256 (Gemma 3: 4 heads on 1 KV head) over a
  // compressed cache, and groups of 1, 2, 3 and 5 (the score blocks of up to
  // 4 heads together, the values in chunks at AVX2), tiles with a tail.
  cases.push_back({1, 1155, 4, 1, 256});
  cases.push_back({1, 333, 5, 1, 256});
  cases.push_back({1, 300, 6, 2, 256});
  cases.push_back({1, 203, 2, 1, 256});
  cases.push_back({1, 77, 2, 2, 256});
  // Sliding windows (Gemma 3's local layers: 4 heads on 1 KV head, head_dim
  // 256): windows shorter and longer than a query block and a key tile,
  // starting inside the memory or the chunk, one the width of the keys (no
  // key masked below), and one query alone (decode).
  cases.push_back({130, 430, 4, 1, 256, 1.0f, 100});
  cases.push_back({64, 64, 4, 1, 64, 1.0f, 7});
  cases.push_back({77, 300, 9, 3, 64, 1.0f, 64});
  cases.push_back({33, 200, 6, 2, 17, 6.0f, 65});
  cases.push_back({130, 130, 2, 2, 33, 1.0f, 1});
  cases.push_back({20, 50, 4, 1, 64, 1.0f, 50});
  cases.push_back({1, 900, 4, 1, 256, 1.0f, 512});
  return cases;
}

// The f32 path's bounds above do not hold for the bf16 paths (bf16
// operands): every test here runs the f32 path unless it says otherwise
// (AttentionBf16Test below), whatever the CPU.
class F32AttentionEnvironment : public ::testing::Environment {
 public:
  void SetUp() override { cpu::SetAttentionImplForTesting(cpu::AttentionImpl::kF32); }
  void TearDown() override { cpu::SetAttentionImplForTesting(cpu::AttentionImpl::kAuto); }
};
[[maybe_unused]] const auto* const kF32Environment =
    ::testing::AddGlobalTestEnvironment(new F32AttentionEnvironment);

class AttentionTest : public ::testing::TestWithParam<AttnCase> {};

TEST_P(AttentionTest, MatchesRef) {
  const AttnData a = MakeData(GetParam(), 21);
  const std::vector<float> got = RunCpuAttention(a);
  EXPECT_TRUE(Report(got, RunRefAttention(a), AttentionBound(a)));
}

// Decoding the last query alone must give the last row of the prefill. The
// decode path (one query) splits the keys instead of padding query rows, so
// its summation order differs: both must lie within the bound of the exact
// value, hence within twice the bound of each other.
TEST_P(AttentionTest, DecodeMatchesLastPrefillRow) {
  const AttnData a = MakeData(GetParam(), 22);
  const AttnCase& c = a.c;
  const std::vector<float> all = RunCpuAttention(a);
  const std::vector<float> last = RunCpuAttention(a, c.num_q - 1, 1);
  const std::vector<double> bound = AttentionBound(a);
  const int64_t row = c.num_heads * c.head_dim;
  for (int64_t t = 0; t < row; ++t) {
    const int64_t i = (c.num_q - 1) * row + t;
    ASSERT_LE(std::abs(static_cast<double>(last[t]) - all[i]), 2.0 * bound[i])
        << "element " << t << ": decode " << last[t] << ", prefill row " << all[i];
  }
}

// Every output is computed by the same operations whatever the thread count
// (the decode path merges its key ranges in range order).
template <typename Run>
void ExpectOneAndTwoThreadsAgreeOn(const Run& run) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const std::vector<float> one = run();
  omp_set_num_threads(2);
  const std::vector<float> two = run();
  omp_set_num_threads(saved);
  ASSERT_EQ(one.size(), two.size());
  for (size_t i = 0; i < one.size(); ++i) ASSERT_EQ(one[i], two[i]) << "element " << i;
}
void ExpectOneAndTwoThreadsAgree(const AttnData& a) {
  ExpectOneAndTwoThreadsAgreeOn([&] { return RunCpuAttention(a); });
}

TEST_P(AttentionTest, OneAndTwoThreadsAgreeBitForBit) { ExpectOneAndTwoThreadsAgree(MakeData(GetParam(), 23)); }

// The log-denominators the pass keeps (what context reconstruction weighs
// keys by) against the twin's, windows included: the f32 row sum's and
// scores' roundings (the header's ε) move log l by about ε, far below 1e-4
// (a wrong row, mask or scale moves it by order 1). Asking for them leaves
// the output as it was, bit for bit; one query takes the tiled pass then,
// not the decode pass, so its output is only within the bound.
TEST_P(AttentionTest, LogDenominatorsMatchRef) {
  const AttnData a = MakeData(GetParam(), 24);
  const AttnCase& c = a.c;
  std::vector<float> lse(c.num_heads * c.num_q, -7.0f), want(lse.size());
  const std::vector<float> with = RunCpuAttention(a, 0, -1, lse.data());
  std::vector<float> out(c.num_q * a.out_stride);
  ref::Attention(a.Q(), a.q_stride, a.K(), a.Vv(), a.kv_head_stride, a.kv_key_stride, out.data(), a.out_stride, c.num_q,
                 c.num_keys, c.num_heads, c.num_kv_heads, c.head_dim, a.scale, c.window, want.data());
  for (size_t i = 0; i < lse.size(); ++i) {
    ASSERT_NEAR(lse[i], want[i], 1e-4 * (1 + std::abs(want[i]))) << "head " << i / c.num_q << " query " << i % c.num_q;
  }
  if (c.num_q > 1) {
    const std::vector<float> without = RunCpuAttention(a);
    for (size_t i = 0; i < with.size(); ++i) ASSERT_EQ(with[i], without[i]) << "element " << i;
  } else {
    EXPECT_TRUE(Report(with, RunRefAttention(a), AttentionBound(a)));
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionTest, ::testing::ValuesIn(SweepCases()),
                         [](const ::testing::TestParamInfo<AttnCase>& info) {
                           return CaseName(info.param);
                         });

// ---- Decode over the fp16 copy of the cache (cpu::AttentionDecodeF16).
// The last query of each case, alone, over K and V rounded to fp16. Every
// fp16 value is exact in f32 and each element is converted as it is loaded,
// so the kernel runs the f32 decode path's operations on the same values:
// equal bit for bit to cpu::Attention over the rounded floats, and within
// the f32 bound of ref::Attention (the twin) over them.
struct HalfDecode {
  AttnData rounded;                  // one query; K and V rounded to fp16
  std::vector<uint16_t> k16, v16;    // the same values as fp16 (index 1 = data start)
};

HalfDecode MakeHalfDecode(const AttnCase& c0, uint32_t seed) {
  AttnData a = MakeData(c0, seed);
  AttnCase c = c0;
  // The last query, alone (it sees every key).
  std::vector<float> q(1 + a.q_stride);
  std::copy(a.q.begin() + 1 + (c.num_q - 1) * a.q_stride, a.q.begin() + 1 + c.num_q * a.q_stride, q.begin() + 1);
  a.q = q;
  c.num_q = 1;
  // The fp16 kernel takes no window: the backend hands it the window's keys.
  c.window = 0;
  a.c = c;
  HalfDecode h;
  h.k16.resize(a.k.size());
  h.v16.resize(a.v.size());
  for (size_t i = 0; i < a.k.size(); ++i) {
    h.k16[i] = Fp32ToFp16(a.k[i]);
    a.k[i] = Fp16ToFp32(h.k16[i]);
    h.v16[i] = Fp32ToFp16(a.v[i]);
    a.v[i] = Fp16ToFp32(h.v16[i]);
  }
  h.rounded = a;
  return h;
}

std::vector<float> RunHalfDecode(const HalfDecode& h) {
  const AttnData& a = h.rounded;
  const AttnCase& c = a.c;
  std::vector<float> out(c.num_heads * c.head_dim, 12345.0f);
  cpu::AttentionDecodeF16(a.Q(), h.k16.data() + 1, h.v16.data() + 1, a.kv_head_stride, a.kv_key_stride,
                          out.data(), c.num_keys, c.num_heads, c.num_kv_heads, c.head_dim, a.scale);
  return out;
}

class AttentionDecodeF16Test : public ::testing::TestWithParam<AttnCase> {};

TEST_P(AttentionDecodeF16Test, MatchesRefOverTheHalfValues) {
  const HalfDecode h = MakeHalfDecode(GetParam(), 41);
  EXPECT_TRUE(Report(RunHalfDecode(h), RunRefAttention(h.rounded), AttentionBound(h.rounded)));
}

TEST_P(AttentionDecodeF16Test, EqualsF32DecodeOfTheRoundedValuesBitForBit) {
  const HalfDecode h = MakeHalfDecode(GetParam(), 42);
  const std::vector<float> half = RunHalfDecode(h);
  const std::vector<float> f32 = RunCpuAttention(h.rounded);
  ASSERT_EQ(half.size(), f32.size());
  for (size_t i = 0; i < half.size(); ++i) ASSERT_EQ(half[i], f32[i]) << "element " << i;
}

TEST_P(AttentionDecodeF16Test, OneAndTwoThreadsAgreeBitForBit) {
  const HalfDecode h = MakeHalfDecode(GetParam(), 43);
  ExpectOneAndTwoThreadsAgreeOn([&] { return RunHalfDecode(h); });
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionDecodeF16Test, ::testing::ValuesIn(SweepCases()),
                         [](const ::testing::TestParamInfo<AttnCase>& info) {
                           return CaseName(info.param);
                         });

// cpu::ToFp16 against its twin Fp32ToFp16, bit for bit: normals, the ties
// between two halves, subnormals, values that round to infinity, zeros and
// infinities, at lengths that leave a scalar tail.
// cpu::FromFp16 against its twin Fp16ToFp32 on every one of the 65,536
// halves, at a length with a ragged tail, bit for bit (NaNs keep their
// payload and come back quiet on both).
// AttentionScratchBytes is what a chunk leaves in the kernels' buffers: the
// bf16 kernels' K and V tiles of the largest chunk so far (a smaller one
// after it adds nothing), none on the f32 kernel. The memory prediction
// adds it (tools/cli/memory_budget.cc).
TEST(AttentionScratch, IsWhatTheChunksLeaveInTheBuffers) {
  const int64_t heads = 9, kv_heads = 3, d = 64;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const cpu::AttentionImpl was = cpu::ActiveAttentionImpl();
  for (const cpu::AttentionImpl impl : cpu::AvailableAttentionImpls()) {
    cpu::SetAttentionImplForTesting(impl);
    cpu::ThreadTeam team(2);
    const cpu::ThreadTeam::Scope scope(team);
    uint64_t most = 0;
    for (const auto& [nq, nk] : {std::pair<int64_t, int64_t>{64, 1000}, {128, 1100}, {32, 700}}) {
      std::vector<float> q(nq * heads * d), k(kv_heads * nk * d), v(kv_heads * nk * d), out(nq * heads * d);
      for (float* a : {q.data(), k.data(), v.data()}) {
        for (int64_t i = 0; i < (a == q.data() ? nq * heads : kv_heads * nk) * d; ++i) a[i] = nd(rng);
      }
      cpu::Attention(q.data(), heads * d, k.data(), v.data(), nk * d, d, out.data(), heads * d, nq, nk, heads, kv_heads,
                     d, 0.125f);
      most = std::max(most, cpu::AttentionScratchBytes(nq, nk, kv_heads, d));
      const bool bf16 = cpu::AttentionHasAmx() || cpu::AttentionHasAvx512Bf16();
      EXPECT_EQ(cpu::AttentionScratchBytes(nq, nk, kv_heads, d) > 0, bf16) << cpu::AttentionImplName(impl);
      // Besides the tiles, a few small buffers (under 4 KiB); the tiles of
      // the longest chunk so far are 786,432 bytes at 1,000 keys; resize
      // alone would have doubled them at 1,100.
      const uint64_t held = team.ScratchBytes();
      EXPECT_GE(held, most) << cpu::AttentionImplName(impl) << " keys " << nk;
      EXPECT_LE(held, most + 4096) << cpu::AttentionImplName(impl) << " keys " << nk;
    }
    // A window takes the same tiles; one query, or a head size the bf16
    // kernels lack, the f32 kernel: none. The tiles grow with head_dim.
    EXPECT_EQ(cpu::AttentionScratchBytes(64, 1000, kv_heads, d, 512),
              cpu::AttentionScratchBytes(64, 1000, kv_heads, d));
    EXPECT_EQ(cpu::AttentionScratchBytes(1, 1000, kv_heads, d), 0u);
    EXPECT_EQ(cpu::AttentionScratchBytes(64, 1000, kv_heads, 96), 0u);
    EXPECT_EQ(cpu::AttentionScratchBytes(64, 1000, kv_heads, 256),
              4 * cpu::AttentionScratchBytes(64, 1000, kv_heads, d));
  }
  cpu::SetAttentionImplForTesting(was);  // (the suite's other tests expect the one they left)
}

TEST(FromFp16, MatchesPortableConversionOnEveryHalf) {
  std::vector<uint16_t> x(65536 + 5);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<uint16_t>(i);
  std::vector<float> y(x.size());
  cpu::FromFp16(x.data(), y.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    const float want = Fp16ToFp32(x[i]);
    uint32_t a, b;
    std::memcpy(&a, &y[i], 4);
    std::memcpy(&b, &want, 4);
    ASSERT_EQ(a, b) << "half " << std::hex << x[i];
  }
}

TEST(ToFp16, MatchesPortableConversionBitForBit) {
  std::vector<float> x = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65519.0f, 65520.0f, -70000.0f, 1e-8f, -3e-5f,
                          6.1e-5f, 5.96e-8f, 2.98e-8f, std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity()};
  // NaNs, quiet and signalling, payloads in the top and the low bits: the
  // payload's top 10 bits kept, quiet, as F16C does.
  for (uint32_t bits : {0x7FC00000u, 0x7FC00001u, 0x7F800001u, 0x7FFFFFFFu, 0xFFC12345u, 0x7F802000u, 0x7FA00000u,
                        0xFF800001u, 0x7FBFFFFFu}) {
    x.push_back(BitsToFloat(bits));
  }
  for (int i = 0; i < 2048; ++i) {
    const uint16_t h = static_cast<uint16_t>(i * 31 + 7);
    if ((h & 0x7C00) == 0x7C00) continue;  // inf / NaN
    // A tie: halfway between h and the next half up.
    x.push_back(0.5f * (Fp16ToFp32(h) + Fp16ToFp32(static_cast<uint16_t>(h + 1))));
  }
  std::mt19937 rng(44);
  std::normal_distribution<float> dist(0.0f, 30.0f);
  for (int i = 0; i < 3001; ++i) x.push_back(dist(rng) * std::exp2(static_cast<float>(i % 40 - 20)));
  for (int64_t n : {int64_t{0}, int64_t{7}, int64_t{17}, static_cast<int64_t>(x.size())}) {
    std::vector<uint16_t> y(n + 1, 0xBEEF);
    cpu::ToFp16(x.data(), y.data(), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y[i], Fp32ToFp16(x[i])) << "x = " << x[i];
    EXPECT_EQ(y[n], 0xBEEF) << "wrote past n";
  }
}

// ---- The bf16 paths (chunks, head_dim 64, 128, 256): AMX-BF16 tiles where
// the CPU has them (head_dim 64 without a window), and the AVX512-BF16 kernel
// (kAuto's choice without AMX, and on AMX machines for the other cases;
// forced there so that they test it at 64 too). Same operands and tolerances.

enum class Bf16Kernel { kAmx, kAvx512Bf16 };

class AttentionBf16Test : public ::testing::TestWithParam<std::tuple<Bf16Kernel, AttnCase>> {
 protected:
  void SetUp() override {
    if (Kernel() == Bf16Kernel::kAmx) {
      cpu::SetAttentionImplForTesting(cpu::AttentionImpl::kAuto);
      if (!cpu::AttentionHasAmx()) GTEST_SKIP() << "AMX-BF16 unavailable (CPU, OS, or SNAPFILL_AMX=0/int8)";
    } else {
      cpu::SetAttentionImplForTesting(cpu::AttentionImpl::kAvx512Bf16);
      if (!cpu::AttentionHasAvx512Bf16()) GTEST_SKIP() << "the CPU has no AVX512-BF16";
    }
  }
  void TearDown() override { cpu::SetAttentionImplForTesting(cpu::AttentionImpl::kF32); }
  static Bf16Kernel Kernel() { return std::get<0>(GetParam()); }
  static const AttnCase& Case() { return std::get<1>(GetParam()); }
};

// Against ref::AttentionBf16 (the same bf16 roundings, double sums): the
// kernel takes each probability against a running max (ref: the exact max)
// and sums scores and products in f32 with a polynomial exp, so its p is the
// reference's times a factor, rounded to bf16 separately: each rounding is
// within 2^-8 of the value (8 significant bits), so the output moves by at
// most 2^-7 of Σ|p̂·v̂| / Σp (abs_out), the tolerance used. Against the exact f32 reference the bf16 operands cost
// more (a score of 10 off by 2^-8 of itself changes its weight by 4%):
// normalized mean square error at most 1e-3, where a wrong key, mask or
// scale gives errors of order 1.
TEST_P(AttentionBf16Test, MatchesBf16Reference) {
  const AttnData a = MakeData(Case(), 31);
  const AttnCase& c = a.c;
  const std::vector<float> got = RunCpuAttention(a);
  std::vector<float> want(c.num_q * a.out_stride), abs_out(c.num_q * a.out_stride);
  ref::AttentionBf16(a.Q(), a.q_stride, a.K(), a.Vv(), a.kv_head_stride, a.kv_key_stride, want.data(), a.out_stride,
                     c.num_q, c.num_keys, c.num_heads, c.num_kv_heads, c.head_dim, a.scale, abs_out.data(), c.window);
  const std::vector<double> exact = RunRefAttention(a);
  const int64_t row = c.num_heads * c.head_dim;
  int64_t bad = 0;
  double err2 = 0.0, ref2 = 0.0;
  std::string first;
  for (int64_t i = 0; i < c.num_q; ++i) {
    for (int64_t t = 0; t < row; ++t) {
      const double g = got[i * row + t], w = want[i * a.out_stride + t];
      const double tol = 0x1p-7 * abs_out[i * a.out_stride + t] + 1e-6;
      if (!(std::abs(g - w) <= tol) && bad++ == 0) {
        first = "query " + std::to_string(i) + " element " + std::to_string(t) + ": " + std::to_string(g) +
                " vs " + std::to_string(w) + " (tolerance " + std::to_string(tol) + ")";
      }
      err2 += (g - exact[i * row + t]) * (g - exact[i * row + t]);
      ref2 += exact[i * row + t] * exact[i * row + t];
    }
  }
  EXPECT_EQ(bad, 0) << "vs ref::AttentionBf16, first: " << first;
  EXPECT_LE(err2 / ref2, 1e-3) << "vs the exact reference";
}

// Each output row depends only on its own query and visible keys (two passes
// over the same key blocks from key 0), so a chunk's attention equals that
// of its two halves run one after the other, bit for bit: what chunked
// prefill relies on.
TEST_P(AttentionBf16Test, HalvesOfAChunkGiveTheSameRows) {
  const AttnData a = MakeData(Case(), 32);
  const AttnCase& c = a.c;
  if (c.num_q < 4) GTEST_SKIP() << "a half of one query would run the f32 decode path";
  const std::vector<float> all = RunCpuAttention(a);
  const int64_t half = c.num_q / 2, row = c.num_heads * c.head_dim;
  AttnData first = a;
  first.c.num_q = half;
  first.c.num_keys = c.num_keys - (c.num_q - half);
  const std::vector<float> lo = RunCpuAttention(first);
  const std::vector<float> hi = RunCpuAttention(a, half, c.num_q - half);
  for (int64_t t = 0; t < half * row; ++t) ASSERT_EQ(lo[t], all[t]) << "first half, element " << t;
  for (int64_t t = 0; t < (c.num_q - half) * row; ++t) {
    ASSERT_EQ(hi[t], all[half * row + t]) << "second half, element " << t;
  }
}

TEST_P(AttentionBf16Test, OneAndTwoThreadsAgreeBitForBit) { ExpectOneAndTwoThreadsAgree(MakeData(Case(), 33)); }

// The log-denominators of the bf16 pass: those of the bf16 scores, as the
// twin's (the same roundings, double sums), within the exp's 7.5e-5 and the
// f32 sums; the output as without them, bit for bit.
TEST_P(AttentionBf16Test, LogDenominatorsMatchBf16Reference) {
  const AttnData a = MakeData(Case(), 34);
  const AttnCase& c = a.c;
  std::vector<float> lse(c.num_heads * c.num_q, -7.0f), want(lse.size());
  const std::vector<float> with = RunCpuAttention(a, 0, -1, lse.data());
  std::vector<float> out(c.num_q * a.out_stride);
  ref::AttentionBf16(a.Q(), a.q_stride, a.K(), a.Vv(), a.kv_head_stride, a.kv_key_stride, out.data(), a.out_stride,
                     c.num_q, c.num_keys, c.num_heads, c.num_kv_heads, c.head_dim, a.scale, nullptr, c.window,
                     want.data());
  for (size_t i = 0; i < lse.size(); ++i) {
    ASSERT_NEAR(lse[i], want[i], 2e-4 + 1e-5 * std::abs(want[i])) << "head " << i / c.num_q << " query " << i % c.num_q;
  }
  const std::vector<float> without = RunCpuAttention(a);
  for (size_t i = 0; i < with.size(); ++i) ASSERT_EQ(with[i], without[i]) << "element " << i;
}

std::vector<AttnCase> AmxCases() {
  return {
      {2, 2, 1, 1, 64},           // two rows, one key block
      {17, 17, 9, 3, 64},         // SmolLM2's heads, a chunk with no memory
      {64, 1088, 9, 3, 64},       // memory 1024 + a chunk of 64
      {100, 131, 4, 4, 64},       // group 1, keys off every block size
      {33, 200, 8, 2, 64, 6.0f},  // a peaky softmax (scores ~ ±30)
      {130, 1500, 9, 3, 64},      // several query blocks, a ragged last one
      {9, 50, 32, 1, 64},         // multi-query: 2 queries per item
      {40, 300, 10, 2, 64},       // 5 heads per KV head: items of 16 queries (80 rows), a ragged last
      // head_dim 128 (Llama 3, Qwen) and 256 (Gemma 3: 4 heads on 1 KV
      // head), on the AVX512-BF16 rows whatever the CPU.
      {100, 131, 4, 4, 128},
      {33, 200, 8, 2, 128, 6.0f},
      {70, 1100, 4, 1, 256},
      {5, 70, 4, 2, 256, 6.0f},
      // Sliding windows (Gemma's local layers): shorter than a key block and
      // than a row group's spread of limits (rows of one group whose first
      // blocks hold no key they see), starting inside the memory or the
      // chunk, one as wide as the keys.
      {130, 430, 4, 1, 256, 1.0f, 100},
      {512, 1024, 4, 1, 256, 1.0f, 512},
      {77, 300, 9, 3, 64, 1.0f, 7},
      {64, 64, 4, 1, 64, 1.0f, 33},
      {33, 200, 6, 2, 128, 6.0f, 65},
      {20, 50, 4, 1, 64, 1.0f, 50},
  };
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionBf16Test,
                         ::testing::Combine(::testing::Values(Bf16Kernel::kAmx, Bf16Kernel::kAvx512Bf16),
                                            ::testing::ValuesIn(AmxCases())),
                         [](const ::testing::TestParamInfo<std::tuple<Bf16Kernel, AttnCase>>& info) {
                           return std::string(std::get<0>(info.param) == Bf16Kernel::kAmx ? "Amx_" : "Avx512Bf16_") +
                                  CaseName(std::get<1>(info.param));
                         });

// With identical keys the softmax is uniform over the visible keys, so query
// i's output is the plain mean of v over keys 0..num_keys-num_q+i: an
// independent check of the causal offset rule.
TEST(AttentionSemantics, UniformScoresAverageVisibleValues) {
  const int64_t num_q = 5, num_keys = 12, d = 3;
  std::vector<float> q(num_q * d, 1.0f), k(num_keys * d, 0.5f), v(num_keys * d), out(num_q * d);
  for (int64_t j = 0; j < num_keys; ++j) {
    for (int64_t t = 0; t < d; ++t) v[j * d + t] = static_cast<float>(j * (t + 1));
  }
  cpu::Attention(q.data(), d, k.data(), v.data(), num_keys * d, d, out.data(), d, num_q, num_keys,
                 1, 1, d, 0.7f);
  for (int64_t i = 0; i < num_q; ++i) {
    const int64_t visible = num_keys - num_q + i + 1;
    const double mean_j = (visible - 1) / 2.0;
    for (int64_t t = 0; t < d; ++t) {
      const double expected = mean_j * (t + 1);
      EXPECT_NEAR(out[i * d + t], expected, 2.0 * kEps * (visible + 8) * expected + 1e-6)
          << "query " << i << " dim " << t;
    }
  }
}

TEST(AttentionSemantics, EmptyChunkWritesNothingAndEmptyWindowVotesZero) {
  std::vector<float> q(8, 1.0f), k(4 * 8, 1.0f), v(4 * 8, 1.0f), out(8, 5.0f), votes(4, 5.0f);
  cpu::Attention(q.data(), 8, k.data(), v.data(), 32, 8, out.data(), 8, 0, 4, 1, 1, 8, 1.0f);
  EXPECT_EQ(out, std::vector<float>(8, 5.0f));
  cpu::WindowScores(q.data(), 8, k.data(), 32, 8, votes.data(), 4, 0, 4, 1, 1, 8, 1.0f);
  EXPECT_EQ(votes, std::vector<float>(4, 0.0f));
}

// ---------------------------------------------------------------------------
// WindowScores

constexpr float kVoteSentinel = -777.0f;

std::vector<float> RunCpuVotes(const AttnData& a) {
  const AttnCase& c = a.c;
  const int64_t votes_stride = c.num_keys + 3;
  std::vector<float> buf(1 + c.num_kv_heads * votes_stride, kVoteSentinel);
  cpu::WindowScores(a.Q(), a.q_stride, a.K(), a.kv_head_stride, a.kv_key_stride, buf.data() + 1,
                    votes_stride, c.num_q, c.num_keys, c.num_heads, c.num_kv_heads, c.head_dim,
                    a.scale);
  EXPECT_EQ(buf[0], kVoteSentinel);
  std::vector<float> dense;
  for (int64_t h = 0; h < c.num_kv_heads; ++h) {
    for (int64_t j = 0; j < votes_stride; ++j) {
      const float x = buf[1 + h * votes_stride + j];
      if (j < c.num_keys) {
        dense.push_back(x);
      } else {
        EXPECT_EQ(x, kVoteSentinel) << "wrote into the padding of KV head " << h;
      }
    }
  }
  return dense;
}

class WindowScoresTest : public ::testing::TestWithParam<AttnCase> {};

TEST_P(WindowScoresTest, MatchesRef) {
  const AttnData a = MakeData(GetParam(), 31);
  const AttnCase& c = a.c;
  const std::vector<float> got = RunCpuVotes(a);
  std::vector<float> ref_votes(c.num_kv_heads * c.num_keys);
  ref::WindowScores(a.Q(), a.q_stride, a.K(), a.kv_head_stride, a.kv_key_stride, ref_votes.data(),
                    c.num_keys, c.num_q, c.num_keys, c.num_heads, c.num_kv_heads, c.head_dim,
                    a.scale);
  // A = max scale·Σ|q k| over all (row, key) pairs.
  double amax = 0.0;
  const int64_t group = c.num_heads / c.num_kv_heads;
  for (int64_t i = 0; i < c.num_q; ++i) {
    for (int64_t h = 0; h < c.num_heads; ++h) {
      const float* qh = a.Q() + i * a.q_stride + h * c.head_dim;
      const float* kh = a.K() + (h / group) * a.kv_head_stride;
      for (int64_t j = 0; j < c.num_keys; ++j) {
        double absd = 0.0;
        for (int64_t t = 0; t < c.head_dim; ++t)
          absd += std::abs(qh[t] * kh[j * a.kv_key_stride + t]);
        amax = std::max(amax, absd * a.scale);
      }
    }
  }
  const double rel =
      2.0 * kEps * (2.0 * (c.head_dim + 2) * amax + c.num_keys + group * c.num_q + 8);
  std::vector<double> want(ref_votes.begin(), ref_votes.end()), tol(want.size());
  for (size_t j = 0; j < want.size(); ++j) tol[j] = rel * want[j] + 1e-30;
  EXPECT_TRUE(Report(got, want, tol));
}

// Each window query's softmax sums to 1 over its visible keys, so each KV
// head's votes sum to the window (num_q): G heads × num_q queries / G. The
// f32 sum of K votes adds <= K·eps relative, each vote <= rel (see header).
TEST_P(WindowScoresTest, VotesSumToWindow) {
  const AttnData a = MakeData(GetParam(), 32);
  const AttnCase& c = a.c;
  const std::vector<float> got = RunCpuVotes(a);
  for (int64_t h = 0; h < c.num_kv_heads; ++h) {
    double sum = 0.0;
    for (int64_t j = 0; j < c.num_keys; ++j) {
      ASSERT_GE(got[h * c.num_keys + j], 0.0f);
      sum += got[h * c.num_keys + j];
    }
    const double tol = 2.0 * kEps * (c.num_keys + c.num_heads * c.num_q + 16) * c.num_q;
    EXPECT_NEAR(sum, static_cast<double>(c.num_q), tol) << "KV head " << h;
  }
}

// Keys after the memory are seen by fewer window queries: key
// memory + i is invisible to queries 0..i-1, so the last key gets exactly
// one query's weight per head and at most 1 vote (plus rounding).
TEST_P(WindowScoresTest, CausalKeysGetBoundedVotes) {
  const AttnData a = MakeData(GetParam(), 33);
  const AttnCase& c = a.c;
  const std::vector<float> got = RunCpuVotes(a);
  const int64_t memory = c.num_keys - c.num_q;
  for (int64_t h = 0; h < c.num_kv_heads; ++h) {
    for (int64_t i = 0; i < c.num_q; ++i) {
      const float vote = got[h * c.num_keys + memory + i];
      EXPECT_LE(vote, (c.num_q - i) * (1.0 + 1e-5)) << "KV head " << h << " key " << memory + i;
    }
  }
}

// The scores kept between the passes (the default) and computed again in
// the second pass (no room kept: WindowScoresKeptFloats() = 0) give the same
// bits; and the kept scratch, grown by this case after the smaller cases
// before it, then reused by a smaller call, gives those bits again.
TEST_P(WindowScoresTest, KeptScoresEqualRecomputedBitForBit) {
  const AttnData a = MakeData(GetParam(), 34);
  const std::vector<float> kept = RunCpuVotes(a);
  cpu::SetWindowScoresKeptFloatsForTesting(0);
  const std::vector<float> recomputed = RunCpuVotes(a);
  cpu::SetWindowScoresKeptFloatsForTesting(-1);
  ASSERT_EQ(kept.size(), recomputed.size());
  for (size_t i = 0; i < kept.size(); ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(kept[i]), std::bit_cast<uint32_t>(recomputed[i])) << "vote " << i;
  }
  const AttnData small = MakeData({GetParam().num_q, GetParam().num_q, GetParam().num_heads,
                                   GetParam().num_kv_heads, GetParam().head_dim},
                                  35);
  const std::vector<float> small_kept = RunCpuVotes(small);
  cpu::SetWindowScoresKeptFloatsForTesting(0);
  const std::vector<float> small_recomputed = RunCpuVotes(small);
  cpu::SetWindowScoresKeptFloatsForTesting(-1);
  EXPECT_EQ(small_kept, small_recomputed);
}

std::vector<AttnCase> VoteCases() {
  std::vector<AttnCase> cases;
  const int64_t head_dims[] = {64, 17, 80, 16, 128};
  int idx = 0;
  for (int64_t window : {1, 8, 32}) {
    for (int64_t memory : {0, 1, 300}) {
      for (int64_t ratio : {1, 3, 4}) {
        const int64_t kv = ratio == 1 ? 2 : 1;
        cases.push_back({window, window + memory, kv * ratio, kv, head_dims[idx++ % 5]});
      }
    }
  }
  cases.push_back({32, 4097, 9, 3, 64});   // SmolLM2-135M, long memory
  cases.push_back({16, 700, 32, 8, 128});  // Llama-3-8B
  cases.push_back({7, 111, 6, 2, 64, 6.0f});
  cases.push_back({8, 90, 71, 1, 24});  // multi-query, 568 score rows
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Shapes, WindowScoresTest, ::testing::ValuesIn(VoteCases()),
                         [](const ::testing::TestParamInfo<AttnCase>& info) {
                           return CaseName(info.param);
                         });

// ---------------------------------------------------------------------------
// QueryLogSumExp and RecallScores (the recall tier's ranking)

class RecallScoresTest : public ::testing::TestWithParam<AttnCase> {};

// The log-denominators match the double twin; and with them, scoring the
// very keys the queries saw gives back WindowScores' votes (each query's
// softmax over its visible keys), which ties the two ops to the vote the
// rest of the engine uses. Keys past a query's visibility are not in that
// identity, so the check runs with one query (all keys visible).
TEST_P(RecallScoresTest, MatchesRef) {
  const AttnData a = MakeData(GetParam(), 41);
  const AttnCase& c = a.c;
  std::vector<float> lse(c.num_heads * c.num_q, -1.0f), lse_ref(lse.size());
  cpu::QueryLogSumExp(a.Q(), a.q_stride, a.K(), a.kv_head_stride, a.kv_key_stride, c.num_q, c.num_keys,
                      c.num_heads, c.num_kv_heads, c.head_dim, a.scale, lse.data());
  ref::QueryLogSumExp(a.Q(), a.q_stride, a.K(), a.kv_head_stride, a.kv_key_stride, c.num_q, c.num_keys,
                      c.num_heads, c.num_kv_heads, c.head_dim, a.scale, lse_ref.data());
  for (size_t i = 0; i < lse.size(); ++i) {
    EXPECT_NEAR(lse[i], lse_ref[i], 1e-4 * (1 + std::abs(lse_ref[i]))) << "row " << i;
  }
  const int64_t stride = c.num_keys + 2;
  std::vector<float> got(c.num_kv_heads * stride, kVoteSentinel), want(c.num_kv_heads * c.num_keys);
  cpu::RecallScores(a.Q(), a.q_stride, c.num_q, lse_ref.data(), a.K(), a.kv_head_stride, a.kv_key_stride,
                    c.num_keys, got.data(), stride, c.num_heads, c.num_kv_heads, c.head_dim, a.scale);
  ref::RecallScores(a.Q(), a.q_stride, c.num_q, lse_ref.data(), a.K(), a.kv_head_stride, a.kv_key_stride,
                    c.num_keys, want.data(), c.num_keys, c.num_heads, c.num_kv_heads, c.head_dim, a.scale);
  for (int64_t h = 0; h < c.num_kv_heads; ++h) {
    for (int64_t j = 0; j < c.num_keys; ++j) {
      const float w = want[h * c.num_keys + j];
      EXPECT_NEAR(got[h * stride + j], w, 1e-4 * w + 1e-30) << "KV head " << h << " key " << j;
    }
    EXPECT_EQ(got[h * stride + c.num_keys], kVoteSentinel) << "wrote into the padding";
  }
  if (c.num_q == 1) {
    std::vector<float> votes(c.num_kv_heads * c.num_keys);
    ref::WindowScores(a.Q(), a.q_stride, a.K(), a.kv_head_stride, a.kv_key_stride, votes.data(), c.num_keys,
                      1, c.num_keys, c.num_heads, c.num_kv_heads, c.head_dim, a.scale);
    for (size_t j = 0; j < votes.size(); ++j) EXPECT_NEAR(want[j], votes[j], 1e-5 * votes[j] + 1e-12);
  }
}

// Context reconstruction's score: the largest weight over the queries and
// the group's heads, against the twin; and the twin against a direct loop
// (a max is no larger than the group's summed weight, and at least its
// average over the group's heads of one query).
TEST_P(RecallScoresTest, MaxWeightMatchesRef) {
  const AttnData a = MakeData(GetParam(), 43);
  const AttnCase& c = a.c;
  std::vector<float> lse(c.num_heads * c.num_q);
  ref::QueryLogSumExp(a.Q(), a.q_stride, a.K(), a.kv_head_stride, a.kv_key_stride, c.num_q, c.num_keys,
                      c.num_heads, c.num_kv_heads, c.head_dim, a.scale, lse.data());
  const int64_t stride = c.num_keys + 2;
  std::vector<float> got(c.num_kv_heads * stride, kVoteSentinel), want(c.num_kv_heads * c.num_keys),
      sum(c.num_kv_heads * c.num_keys);
  cpu::RecallScores(a.Q(), a.q_stride, c.num_q, lse.data(), a.K(), a.kv_head_stride, a.kv_key_stride, c.num_keys,
                    got.data(), stride, c.num_heads, c.num_kv_heads, c.head_dim, a.scale, /*max_weight=*/true);
  ref::RecallScores(a.Q(), a.q_stride, c.num_q, lse.data(), a.K(), a.kv_head_stride, a.kv_key_stride, c.num_keys,
                    want.data(), c.num_keys, c.num_heads, c.num_kv_heads, c.head_dim, a.scale, /*max_weight=*/true);
  ref::RecallScores(a.Q(), a.q_stride, c.num_q, lse.data(), a.K(), a.kv_head_stride, a.kv_key_stride, c.num_keys,
                    sum.data(), c.num_keys, c.num_heads, c.num_kv_heads, c.head_dim, a.scale);
  const int64_t group = c.num_heads / c.num_kv_heads;
  for (int64_t h = 0; h < c.num_kv_heads; ++h) {
    for (int64_t j = 0; j < c.num_keys; ++j) {
      const float w = want[h * c.num_keys + j];
      EXPECT_NEAR(got[h * stride + j], w, 1e-4 * w + 1e-30) << "KV head " << h << " key " << j;
      const float total = sum[h * c.num_keys + j] * group;  // Σ over the group's heads and the queries
      EXPECT_LE(w, total * (1 + 1e-5) + 1e-30);
      EXPECT_GE(w * group * c.num_q, total * (1 - 1e-5));
      // A direct loop over the rows for one key of each head.
      if (j == c.num_keys / 2) {
        double best = 0;
        for (int64_t qh = h * group; qh < (h + 1) * group; ++qh) {
          for (int64_t i = 0; i < c.num_q; ++i) {
            double dot = 0;
            for (int64_t d = 0; d < c.head_dim; ++d) {
              dot += double(a.Q()[i * a.q_stride + qh * c.head_dim + d]) *
                     a.K()[h * a.kv_head_stride + j * a.kv_key_stride + d];
            }
            best = std::max(best, std::exp(dot * a.scale - lse[qh * c.num_q + i]));
          }
        }
        EXPECT_NEAR(w, best, 1e-4 * best + 1e-30);
      }
    }
    EXPECT_EQ(got[h * stride + c.num_keys], kVoteSentinel) << "wrote into the padding";
  }
}

// The largest weights on the chunk attention's bf16 operands (context
// reconstruction beside the bf16 attention's denominators), on the tiles
// and on the AVX512-BF16 rows: against their twin (the same roundings, in
// double: f32 sums of exact products), and within the bf16 roundings of the
// f32 op. Where the attention takes f32 they write nothing and say so.
TEST_P(RecallScoresTest, MaxWeightOnBf16OperandsMatchesItsTwin) {
  const AttnData a = MakeData(GetParam(), 44);
  const AttnCase& c = a.c;
  std::vector<float> lse(c.num_heads * c.num_q);
  ref::QueryLogSumExp(a.Q(), a.q_stride, a.K(), a.kv_head_stride, a.kv_key_stride, c.num_q, c.num_keys, c.num_heads,
                      c.num_kv_heads, c.head_dim, a.scale, lse.data());
  const int64_t stride = c.num_keys + 2;
  std::vector<float> want(c.num_kv_heads * c.num_keys), f32(c.num_kv_heads * c.num_keys);
  ref::RecallMaxWeightsBf16(a.Q(), a.q_stride, c.num_q, lse.data(), a.K(), a.kv_head_stride, a.kv_key_stride,
                            c.num_keys, want.data(), c.num_keys, c.num_heads, c.num_kv_heads, c.head_dim, a.scale);
  ref::RecallScores(a.Q(), a.q_stride, c.num_q, lse.data(), a.K(), a.kv_head_stride, a.kv_key_stride, c.num_keys,
                    f32.data(), c.num_keys, c.num_heads, c.num_kv_heads, c.head_dim, a.scale, /*max_weight=*/true);
  const bool bf16_dim = c.head_dim == 64 || c.head_dim == 128 || c.head_dim == 256;
  for (const cpu::AttentionImpl impl :
       {cpu::AttentionImpl::kF32, cpu::AttentionImpl::kAvx512Bf16, cpu::AttentionImpl::kAmxBf16}) {
    cpu::SetAttentionImplForTesting(impl);
    const bool route = c.num_q > 1 && bf16_dim &&
                       (impl == cpu::AttentionImpl::kAmxBf16 ? cpu::AttentionHasAmx() : cpu::AttentionHasAvx512Bf16());
    SCOPED_TRACE(cpu::AttentionImplName(impl));
    std::vector<float> got(c.num_kv_heads * stride, kVoteSentinel);
    ASSERT_EQ(
        cpu::RecallMaxWeightsBf16(a.Q(), a.q_stride, c.num_q, lse.data(), a.K(), a.kv_head_stride, a.kv_key_stride,
                                  c.num_keys, got.data(), stride, c.num_heads, c.num_kv_heads, c.head_dim, a.scale),
        route);
    for (int64_t h = 0; h < c.num_kv_heads; ++h) {
      for (int64_t j = 0; j < c.num_keys; ++j) {
        const float w = want[h * c.num_keys + j], x = f32[h * c.num_keys + j];
        if (!route) {
          ASSERT_EQ(got[h * stride + j], kVoteSentinel) << "wrote where the attention takes f32";
          continue;
        }
        ASSERT_NEAR(got[h * stride + j], w, 1e-4 * w + 1e-30) << "KV head " << h << " key " << j;
        // bf16 operands: each score within about 2^-8 of Σ|q·k| (a few
        // units at these scales) of the f32 one, so each weight within a
        // factor e^(±0.1·scale multiplier) or so of the f32 weight.
        ASSERT_NEAR(std::log(std::max(w, 1e-30f)), std::log(std::max(x, 1e-30f)), 0.1 * c.scale_mult + 1e-3)
            << "KV head " << h << " key " << j;
      }
      EXPECT_EQ(got[h * stride + c.num_keys], kVoteSentinel) << "wrote into the padding";
    }
  }
  cpu::SetAttentionImplForTesting(cpu::AttentionImpl::kF32);
}

std::vector<AttnCase> RecallCases() {
  // (Then a chunk's repetition: several query blocks per KV head in
  // QueryLogSumExp, a ragged last one, and key pieces in RecallScores; and
  // Gemma 3's head_dim 256 with padded rows on the bf16 operands.)
  return {{1, 5, 2, 1, 16},         {1, 300, 9, 3, 64},         {30, 2100, 9, 3, 64},
          {7, 111, 6, 2, 64, 6.0f}, {5, 1500, 32, 8, 128},      {3, 70, 4, 4, 17},
          {300, 1400, 9, 3, 64},    {130, 700, 4, 1, 64, 6.0f}, {70, 300, 4, 1, 256}};
}

INSTANTIATE_TEST_SUITE_P(Shapes, RecallScoresTest, ::testing::ValuesIn(RecallCases()),
                         [](const ::testing::TestParamInfo<AttnCase>& info) {
                           return CaseName(info.param);
                         });

}  // namespace
}  // namespace snapfill
