// The AMX-BF16 tile path of cpu::MatMul (m >= 16, Q4_0 / Q4_1 / Q5_0 / Q5_1 /
// Q8_0 / F16 / BF16 / Q4_K / Q5_K / Q6_K weights) against its scalar twin ref::MatMulBf16, and its two conversions
// (weights to bf16 B tiles, activations to bf16) bit for bit against
// Fp32ToBf16Rne of the reference values.
//
// Tolerance: the operands are bf16, so every product is exact in f32; the
// only rounding is the f32 accumulation of k products per output (inside a
// tile op and across the k/32 tile ops). Each rounding is at most 2^-24 times
// a partial sum, itself at most T = Σ|products| (reported by the reference),
// so |amx - ref| <= (k + 64) · 2^-24 · T.
// Against the exact product (ref::MatMul, f32 operands) the bf16 rounding of
// both operands (8 significant bits: each off by at most 2^-8 of itself)
// adds at most 2^-7 + 2^-16 of each product's magnitude: checked too, so the path cannot drift from the model's weights.
// Tests skip (with a message) where the CPU or OS offers no AMX-BF16.
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_amx.h"
#include "kernels/cpu/thread_team.h"
#include "kernels/quant_blocks.h"
#include "kernels/ref/quant_ref.h"
#include "tests/testing/matmul_data.h"

namespace snapfill {
namespace {

constexpr const char* kNoAmxBf16Message =
    "AMX-BF16 unavailable (CPU lacks AMX-BF16/AVX512_BF16, the OS refused the tile state, or SNAPFILL_AMX is "
    "0 or int8)";

std::vector<uint8_t> MakeWeights(GgmlType type, int64_t n, int64_t k, size_t row_bytes, uint32_t seed) {
  return testing::QuantizedWeights(type, n, k, row_bytes, seed, 0.03f);
}

// testing::HiddenStates plus a value below f32's normal range (bf16 flushes
// it to zero) every 7th token.
std::vector<float> MakeActivations(int64_t m, int64_t k, int64_t stride, uint32_t seed) {
  std::vector<float> x = testing::HiddenStates(m, k, stride, seed);
  for (int64_t i = 3; i < m; i += 7) x[i * stride + k / 2] = 1e-39f;
  return x;
}

struct Bf16Case {
  GgmlType type;
  int64_t m, n, k;
  int64_t x_pad = 0, y_pad = 0, w_pad = 0;
};

std::string CaseName(const Bf16Case& c) {
  std::ostringstream os;
  os << GetTypeTraits(c.type).name << "_m" << c.m << "_n" << c.n << "_k" << c.k;
  if (c.x_pad || c.y_pad || c.w_pad) os << "_strided";
  return os.str();
}

void PrintTo(const Bf16Case& c, std::ostream* os) { *os << CaseName(c); }

class MatMulAmxBf16Test : public ::testing::TestWithParam<Bf16Case> {
 protected:
  void SetUp() override {
    if (!cpu::MatMulHasAmxBf16()) GTEST_SKIP() << kNoAmxBf16Message;
    cpu::SetMatMulImplForTesting(cpu::MatMulImpl::kAuto);
  }
};

TEST_P(MatMulAmxBf16Test, MatchesBf16ReferenceAndStaysNearExact) {
  const Bf16Case c = GetParam();
  const int64_t x_stride = c.k + c.x_pad, y_stride = c.n + c.y_pad;
  const size_t row_bytes = RowBytes(c.type, c.k) + c.w_pad;
  const auto w = MakeWeights(c.type, c.n, c.k, row_bytes, 101 + c.n);
  const auto x = MakeActivations(c.m, c.k, x_stride, 7 + c.m);

  const float kSentinel = -12345.0f;
  std::vector<float> y(c.m * y_stride, kSentinel);
  cpu::MatMul(x.data(), c.m, c.k, x_stride, w.data(), c.type, c.n, row_bytes, y.data(), y_stride);

  std::vector<float> yb(c.m * c.n), ye(c.m * c.n);
  std::vector<double> abs_terms(c.m * c.n);
  ASSERT_TRUE(ref::MatMulBf16(x.data(), c.m, c.k, x_stride, w.data(), c.type, c.n, row_bytes, yb.data(), c.n,
                              abs_terms.data()));
  ASSERT_TRUE(ref::MatMul(x.data(), c.m, c.k, x_stride, w.data(), c.type, c.n, row_bytes, ye.data(), c.n));

  const double sum_n = static_cast<double>(c.k) + 64.0;
  int64_t bad_ref = 0, bad_exact = 0;
  std::string first_ref, first_exact;
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t j = 0; j < c.n; ++j) {
      const int64_t idx = i * c.n + j;
      const double got = y[i * y_stride + j];
      const double tol = sum_n * 0x1p-24 * abs_terms[idx];
      if (!(std::fabs(got - yb[idx]) <= tol) && bad_ref++ == 0) {
        std::ostringstream os;
        os << "[" << i << "," << j << "] amx=" << got << " ref_bf16=" << yb[idx] << " tol=" << tol;
        first_ref = os.str();
      }
      // Each operand is off by at most 2^-8 of itself (plus the flushed
      // subnormals, far below any term here); abs_terms sums the rounded
      // products, at least (1 - 2^-7) of the exact ones.
      const double tol_exact = tol + (0x1p-7 + 0x1p-16) * abs_terms[idx] * (1 + 0x1p-6) + 1e-30;
      if (!(std::fabs(got - ye[idx]) <= tol_exact) && bad_exact++ == 0) {
        std::ostringstream os;
        os << "[" << i << "," << j << "] amx=" << got << " exact=" << ye[idx] << " tol=" << tol_exact;
        first_exact = os.str();
      }
    }
    for (int64_t j = c.n; j < y_stride; ++j) {
      ASSERT_EQ(y[i * y_stride + j], kSentinel) << "wrote y padding at [" << i << "," << j << "]";
    }
  }
  EXPECT_EQ(bad_ref, 0) << "vs ref::MatMulBf16, first " << first_ref;
  EXPECT_EQ(bad_exact, 0) << "vs ref::MatMul, first " << first_exact;
}

// The types of 32-element blocks, and the 256-element K-quants (k a
// multiple of 256).
constexpr GgmlType kBlockTypes[] = {GgmlType::kQ4_1, GgmlType::kQ4_0, GgmlType::kQ8_0, GgmlType::kF16,
                                    GgmlType::kBF16, GgmlType::kQ5_0, GgmlType::kQ5_1};
constexpr GgmlType kSuperTypes[] = {GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K};

std::vector<Bf16Case> AllCases() {
  std::vector<Bf16Case> cases;
  for (GgmlType t : kSuperTypes) {
    for (int64_t m : {16, 33}) cases.push_back({t, m, 40, 256});
    // Down 1536 -> 576 (SmolLM2), a 2,048-wide layer, and K cut in parts.
    cases.push_back({t, 24, 576, 1536});
    cases.push_back({t, 40, 64, 2048});
    cases.push_back({t, 100, 200, 768, 5, 9, 2});
  }
  for (GgmlType t : kBlockTypes) {
    // Token counts around the 32-token pair of tiles, row counts around the
    // 32-row pair of groups (one group absent, one partial).
    for (int64_t m : {16, 17, 32, 33, 100}) {
      for (int64_t n : {5, 17, 32, 40}) cases.push_back({t, m, n, 96});
    }
    cases.push_back({t, 512, 40, 576});
    for (int64_t k : {32, 64, 160}) cases.push_back({t, 33, 17, k});
    // SmolLM2-135M shapes: q/o 576->576, k/v 576->192, up 576->1536, down 1536->576.
    cases.push_back({t, 48, 576, 576});
    cases.push_back({t, 20, 192, 576});
    cases.push_back({t, 16, 1536, 576});
    cases.push_back({t, 24, 576, 1536});
    // Many token pairs and panels per thread (units of several pairs).
    cases.push_back({t, 300, 300, 64});
    // One panel holding every row pair and four token blocks: the split by
    // tokens that Q, K, V and O get at 1,024 tokens and more.
    cases.push_back({t, 800, 96, 64});
    // Non-contiguous x / y / weight rows.
    cases.push_back({t, 33, 17, 96, 7, 3, 4});
    cases.push_back({t, 100, 200, 576, 5, 9, 2});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(AmxBf16, MatMulAmxBf16Test, ::testing::ValuesIn(AllCases()),
                         [](const auto& info) { return CaseName(info.param); });

// The weight unpacking: tile b, row r, column j, half p holds the bf16 of
// element 32b + 2r + p of weight row j, exactly Fp32ToBf16Rne of
// ref::DequantizeRow's value; rows past the group are zero.
TEST(MatMulAmxBf16UnpackTest, TilesHoldRoundedReferenceWeights) {
  if (!cpu::MatMulHasAmxBf16()) GTEST_SKIP() << kNoAmxBf16Message;
  for (GgmlType t : {GgmlType::kQ4_1, GgmlType::kQ4_0, GgmlType::kQ8_0, GgmlType::kF16, GgmlType::kBF16,
                     GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K}) {
    for (int rows : {16, 5}) {
      const int64_t k = GetTypeTraits(t).block_size == 256 ? 512 : 96;
      const size_t row_bytes = RowBytes(t, k) + 4;  // padded rows, 2-byte aligned as ggml blocks need
      auto w = MakeWeights(t, 16, k, row_bytes, 17 + rows);
      // Float types: subnormals (bf16's go to zero, as Fp32ToBf16Rne has
      // them; fp16's are normal in f32), infinities, the extremes, a NaN.
      const uint16_t f16_specials[] = {0x0001, 0x8001, 0x03FF, 0x7BFF, 0xFC00, 0x7E00, 0x3C01};
      const uint16_t bf16_specials[] = {0x0001, 0x8001, 0x007F, 0x7F7F, 0xFF80, 0x7FC0, 0x3F81};
      if (t == GgmlType::kF16 || t == GgmlType::kBF16) {
        const uint16_t* sp = t == GgmlType::kF16 ? f16_specials : bf16_specials;
        for (int i = 0; i < 7; ++i) std::memcpy(w.data() + 1 * row_bytes + 2 * (i * 13), &sp[i], 2);
      }
      std::vector<uint8_t> tiles(k / 32 * 1024, 0xAB);
      cpu::internal::UnpackBf16TilesForTesting(w.data(), t, row_bytes, rows, k, tiles.data());
      std::vector<float> deq(k);
      for (int j = 0; j < 16; ++j) {
        if (j < rows) {
          ASSERT_TRUE(ref::DequantizeRow(t, w.data() + j * row_bytes, deq.data(), k));
        }
        for (int64_t e = 0; e < k; ++e) {
          const int64_t b = e / 32, r = (e % 32) / 2, p = e % 2;
          uint16_t got;
          std::memcpy(&got, tiles.data() + b * 1024 + r * 64 + 4 * j + 2 * p, 2);
          const uint16_t want = j < rows ? Fp32ToBf16Rne(deq[e]) : 0;
          ASSERT_EQ(got, want) << GetTypeTraits(t).name << " rows=" << rows << " row " << j << " element " << e;
        }
      }
    }
  }
}

// The activation conversion rounds exactly as Fp32ToBf16Rne, including ties,
// subnormals (to signed zero), infinities, NaN and a tail past a multiple of 32.
TEST(MatMulAmxBf16ConvertTest, MatchesFp32ToBf16RneBitForBit) {
  if (!cpu::MatMulHasAmxBf16()) GTEST_SKIP() << kNoAmxBf16Message;
  std::mt19937 rng(11);
  std::uniform_int_distribution<uint32_t> bits;
  std::vector<float> x;
  const float specials[] = {0.0f, -0.0f, 1.0f, -1.0f, 1e-39f, -1e-39f, std::numeric_limits<float>::min(),
                            std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::max(),
                            -std::numeric_limits<float>::max(), std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(), std::nanf("")};
  for (float f : specials) x.push_back(f);
  for (uint32_t u : {0x3F808000u, 0x3F818000u, 0x3F80FFFFu, 0x7F7F8000u, 0x00808000u, 0x807FFFFFu}) {
    float f;
    std::memcpy(&f, &u, 4);
    x.push_back(f);  // ties to even both ways, just-below-tie, overflow to inf, smallest normal tie
  }
  while (x.size() < 32 * 40 + 7) {
    const uint32_t u = bits(rng);
    float f;
    std::memcpy(&f, &u, 4);
    x.push_back(f);
  }
  std::vector<uint16_t> got(x.size(), 0xFFFF);
  cpu::internal::ConvertRowBf16ForTesting(x.data(), static_cast<int64_t>(x.size()), got.data());
  for (size_t i = 0; i < x.size(); ++i) {
    uint32_t u;
    std::memcpy(&u, &x[i], 4);
    ASSERT_EQ(got[i], Fp32ToBf16Rne(x[i])) << "input bits 0x" << std::hex << u;
  }
}

// Every output is computed by one kernel call with a fixed operation order,
// so 1 and 2 threads agree bit for bit.
TEST(MatMulAmxBf16ThreadsTest, OneThreadEqualsTwo) {
  if (!cpu::MatMulHasAmxBf16()) GTEST_SKIP() << kNoAmxBf16Message;
  for (GgmlType t : {GgmlType::kQ4_1, GgmlType::kQ4_0, GgmlType::kQ8_0}) {
    const int64_t m = 300, n = 75, k = 576;
    const size_t row_bytes = RowBytes(t, k);
    const auto w = MakeWeights(t, n, k, row_bytes, 5);
    const auto x = MakeActivations(m, k, k, 6);
    EXPECT_TRUE(testing::MatMulSameOnOneAndTwoThreads(x.data(), m, k, w.data(), t, n, row_bytes))
        << GetTypeTraits(t).name;
  }
}

// A smaller call after a larger one reuses the bf16 copy of X and the panel
// buffer; stale rows must not reach its outputs.
TEST(MatMulAmxBf16ScratchTest, SmallerCallAfterLargerIsUnchanged) {
  if (!cpu::MatMulHasAmxBf16()) GTEST_SKIP() << kNoAmxBf16Message;
  for (GgmlType t : {GgmlType::kQ4_1, GgmlType::kQ8_0}) {
    const int64_t n = 33, k = 96;
    const size_t row_bytes = RowBytes(t, k);
    const auto w = MakeWeights(t, n, k, row_bytes, 9);
    const auto w_big = MakeWeights(t, 70, 2 * k, RowBytes(t, 2 * k), 19);
    auto big = MakeActivations(64, 2 * k, 2 * k, 10);
    for (float& v : big) v *= 1e4f;
    const auto small = MakeActivations(17, k, k, 11);
    std::vector<float> before(17 * n), after(17 * n), y_big(64 * 70);
    cpu::MatMul(small.data(), 17, k, k, w.data(), t, n, row_bytes, before.data(), n);
    cpu::MatMul(big.data(), 64, 2 * k, 2 * k, w_big.data(), t, 70, RowBytes(t, 2 * k), y_big.data(), 70);
    cpu::MatMul(small.data(), 17, k, k, w.data(), t, n, row_bytes, after.data(), n);
    EXPECT_EQ(std::memcmp(before.data(), after.data(), before.size() * sizeof(float)), 0)
        << GetTypeTraits(t).name;
  }
}

// cpu::ProductScratchBytes bounds what the AMX-BF16 products leave in the
// team's buffers (the memory prediction takes it): after every way a layer
// calls them (Q/K/V shared and normed, the output projection's add, the
// SwiGLU in front of the down projection, the fused feed-forward block), at
// SmolLM2's widths and odd token counts, up to 3x over (X and h are sized
// for the widest input whichever path runs).
TEST(MatMulAmxBf16ScratchTest, StaysWithinTheBound) {
  if (!cpu::MatMulHasAmxBf16()) GTEST_SKIP() << kNoAmxBf16Message;
  const GgmlType t = GgmlType::kQ4_1;
  const int64_t d = 576, ff = 1536;
  const size_t d_bytes = RowBytes(t, d), ff_bytes = RowBytes(t, ff);
  const auto wq = MakeWeights(t, d, d, d_bytes, 21), wg = MakeWeights(t, ff, d, d_bytes, 22);
  const auto wu = MakeWeights(t, ff, d, d_bytes, 23), wd = MakeWeights(t, d, ff, ff_bytes, 24);
  const std::vector<float> norm(d, 1.0f);
  cpu::ThreadTeam team(2);
  const cpu::ThreadTeam::Scope scope(team);
  for (const int64_t m : {40, 333, 1030}) {
    const auto x = MakeActivations(m, d, d, 25);
    std::vector<float> q(m * d), k(m * d), gate(m * ff), up(m * ff), xn(m * d), y(m * d);
    const cpu::MatMulOut qk[2] = {{wq.data(), d, d_bytes, q.data(), d}, {wq.data(), d, d_bytes, k.data(), d}};
    cpu::MatMulShared(x.data(), m, d, d, t, qk, 2);
    cpu::NormMatMulShared(x.data(), m, d, d, cpu::RowNorm{norm.data(), 1e-5f, xn.data(), d}, t, qk, 2);
    cpu::MatMulAdd(q.data(), m, d, d, wq.data(), t, d, d_bytes, y.data(), d);
    const cpu::MatMulOut gu[2] = {{wg.data(), ff, d_bytes, gate.data(), ff}, {wu.data(), ff, d_bytes, up.data(), ff}};
    cpu::MatMulShared(x.data(), m, d, d, t, gu, 2);
    cpu::MatMulSwiGlu(gate.data(), up.data(), m, ff, ff, wd.data(), t, d, ff_bytes, y.data(), d, /*add=*/true);
    cpu::FeedForward(x.data(), m, d, d, wg.data(), wu.data(), t, ff, d_bytes, wd.data(), t, d, ff_bytes, y.data(), d,
                     /*add=*/true);
    const uint64_t bound = cpu::ProductScratchBytes(m, ff, ff, 2);
    EXPECT_LE(team.ScratchBytes(), bound) << m << " tokens";
    EXPECT_GE(3 * team.ScratchBytes(), bound) << m << " tokens";
  }
  // Another path, or a one-token product: nothing of the tiles' own.
  cpu::SetMatMulImplForTesting(cpu::MatMulImpl::kAmxInt8);
  EXPECT_EQ(cpu::ProductScratchBytes(1030, ff, ff, 2), 0u);
  cpu::SetMatMulImplForTesting(cpu::MatMulImpl::kAuto);
  EXPECT_EQ(cpu::ProductScratchBytes(1, ff, ff, 2), 0u);
}

}  // namespace
}  // namespace snapfill
