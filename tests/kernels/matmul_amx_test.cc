// The AMX-INT8 tile path of cpu::MatMul (m >= 16, Q4_0 / Q4_1 / Q8_0
// weights; MatMulImpl::kAmxInt8, since kAuto takes AMX-BF16 where the CPU
// has it), against ref::MatMulQuantizedActivations and against the AVX-512
// VNNI path (MatMulImpl::kNoAmx).
//
// Tolerance: the tile path computes every block dot exactly (int32) and
// multiplies by dx·dw, a product of two fp16 values that is exact in f32; the
// only rounding is one f32 FMA chain per output over the blocks: k/32 terms,
// plus k/32 aux terms for Q4_1. Each rounding is at most 2^-24 times a
// partial sum, itself at most T = Σ|terms| (reported by the reference), so
//   |amx - refq| <= N · 2^-24 · T  with N = k/16 (+ 64 slack, as matmul_test).
// The VNNI path obeys the same bound, so |amx - vnni| <= 2 · N · 2^-24 · T.
// Tests skip (with a message) where the CPU or OS offers no AMX.
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_amx.h"
#include "kernels/quant_blocks.h"
#include "kernels/ref/quant_ref.h"
#include "tests/testing/matmul_data.h"

namespace snapfill {
namespace {

constexpr const char* kNoAmxMessage =
    "AMX-INT8 unavailable (CPU lacks AMX-TILE/AMX-INT8, the OS refused the tile state, or SNAPFILL_AMX=0)";

std::vector<uint8_t> MakeWeights(GgmlType type, int64_t n, int64_t k, size_t row_bytes, uint32_t seed) {
  return testing::QuantizedWeights(type, n, k, row_bytes, seed, 0.03f);
}
using testing::HiddenStates;

// Selects the AMX-INT8 path (kAuto may take AMX-BF16) for one test.
struct UseAmxInt8 {
  UseAmxInt8() { cpu::SetMatMulImplForTesting(cpu::MatMulImpl::kAmxInt8); }
  ~UseAmxInt8() { cpu::SetMatMulImplForTesting(cpu::MatMulImpl::kAuto); }
};

struct AmxCase {
  GgmlType type;
  int64_t m, n, k;
  int64_t x_pad = 0, y_pad = 0, w_pad = 0;  // extra stride (floats / floats / bytes)
};

std::string CaseName(const AmxCase& c) {
  std::ostringstream os;
  os << GetTypeTraits(c.type).name << "_m" << c.m << "_n" << c.n << "_k" << c.k;
  if (c.x_pad || c.y_pad || c.w_pad) os << "_strided";
  return os.str();
}

void PrintTo(const AmxCase& c, std::ostream* os) { *os << CaseName(c); }

class MatMulAmxTest : public ::testing::TestWithParam<AmxCase> {
 protected:
  void SetUp() override {
    if (!cpu::MatMulHasAmx()) GTEST_SKIP() << kNoAmxMessage;
  }
  void TearDown() override { cpu::SetMatMulImplForTesting(cpu::MatMulImpl::kAuto); }
};

TEST_P(MatMulAmxTest, MatchesQuantizedReferenceAndVnni) {
  const AmxCase c = GetParam();
  const int64_t x_stride = c.k + c.x_pad, y_stride = c.n + c.y_pad;
  const size_t row_bytes = RowBytes(c.type, c.k) + c.w_pad;
  const auto w = MakeWeights(c.type, c.n, c.k, row_bytes, 101 + c.n);
  const auto x = HiddenStates(c.m, c.k, x_stride, 7 + c.m);

  const float kSentinel = -12345.0f;
  std::vector<float> y_amx(c.m * y_stride, kSentinel), y_vnni(c.m * y_stride, kSentinel);
  cpu::SetMatMulImplForTesting(cpu::MatMulImpl::kAmxInt8);
  cpu::MatMul(x.data(), c.m, c.k, x_stride, w.data(), c.type, c.n, row_bytes, y_amx.data(), y_stride);
  cpu::SetMatMulImplForTesting(cpu::MatMulImpl::kNoAmx);
  cpu::MatMul(x.data(), c.m, c.k, x_stride, w.data(), c.type, c.n, row_bytes, y_vnni.data(), y_stride);

  std::vector<float> yq(c.m * c.n);
  std::vector<double> abs_terms(c.m * c.n);
  ASSERT_TRUE(ref::MatMulQuantizedActivations(x.data(), c.m, c.k, x_stride, w.data(), c.type, c.n, row_bytes,
                                              yq.data(), c.n, abs_terms.data()));

  const double sum_n = static_cast<double>(c.k) / 16.0 + 64.0;
  int64_t bad_ref = 0, bad_vnni = 0;
  std::string first_ref, first_vnni;
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t j = 0; j < c.n; ++j) {
      const int64_t idx = i * c.n + j;
      const double got = y_amx[i * y_stride + j];
      const double tol = sum_n * 0x1p-24 * abs_terms[idx];
      const double d_ref = std::fabs(got - yq[idx]);
      if (!(d_ref <= tol) && bad_ref++ == 0) {
        std::ostringstream os;
        os << "[" << i << "," << j << "] amx=" << got << " refq=" << yq[idx] << " tol=" << tol;
        first_ref = os.str();
      }
      const double d_vnni = std::fabs(got - y_vnni[i * y_stride + j]);
      if (!(d_vnni <= 2 * tol) && bad_vnni++ == 0) {
        std::ostringstream os;
        os << "[" << i << "," << j << "] amx=" << got << " vnni=" << y_vnni[i * y_stride + j]
           << " tol=" << 2 * tol;
        first_vnni = os.str();
      }
    }
    for (int64_t j = c.n; j < y_stride; ++j) {
      ASSERT_EQ(y_amx[i * y_stride + j], kSentinel) << "wrote y padding at [" << i << "," << j << "]";
    }
  }
  EXPECT_EQ(bad_ref, 0) << "vs ref::MatMulQuantizedActivations, first " << first_ref;
  EXPECT_EQ(bad_vnni, 0) << "vs the VNNI path, first " << first_vnni;
}

std::vector<AmxCase> AllCases() {
  std::vector<AmxCase> cases;
  for (GgmlType t : {GgmlType::kQ4_1, GgmlType::kQ4_0, GgmlType::kQ8_0}) {
    // Token counts around the 16-token tile (exact, +1, odd) and a prefill
    // batch; row counts below, at and off the 16-row groups.
    for (int64_t m : {16, 17, 33, 100}) {
      for (int64_t n : {5, 17, 40}) cases.push_back({t, m, n, 96});
    }
    cases.push_back({t, 512, 40, 576});
    // k = 32 and 64: one and two blocks (the kernel's 2-block pipeline).
    for (int64_t k : {32, 64, 160}) cases.push_back({t, 33, 17, k});
    // SmolLM2-135M shapes: q/o 576->576, k/v 576->192, up 576->1536, down 1536->576.
    cases.push_back({t, 48, 576, 576});
    cases.push_back({t, 20, 192, 576});
    cases.push_back({t, 16, 1536, 576});
    cases.push_back({t, 24, 576, 1536});
    // Non-contiguous x / y / weight rows.
    cases.push_back({t, 33, 17, 96, 7, 3, 4});
    cases.push_back({t, 100, 200, 576, 5, 9, 2});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Amx, MatMulAmxTest, ::testing::ValuesIn(AllCases()),
                         [](const auto& info) { return CaseName(info.param); });

// Every output is computed by one tile kernel call with a fixed operation
// order, so 1 and 2 threads agree bit for bit.
TEST(MatMulAmxThreadsTest, OneThreadEqualsTwo) {
  if (!cpu::MatMulHasAmx()) GTEST_SKIP() << kNoAmxMessage;
  UseAmxInt8 int8;
  for (GgmlType t : {GgmlType::kQ4_1, GgmlType::kQ4_0, GgmlType::kQ8_0}) {
    const int64_t m = 300, n = 75, k = 576;  // several units per thread
    const size_t row_bytes = RowBytes(t, k);
    const auto w = MakeWeights(t, n, k, row_bytes, 5);
    const auto x = HiddenStates(m, k, k, 6);
    EXPECT_TRUE(testing::MatMulSameOnOneAndTwoThreads(x.data(), m, k, w.data(), t, n, row_bytes))
        << GetTypeTraits(t).name;
  }
}

// A call with fewer tokens after a larger one reuses the per-thread scratch
// buffers; stale quantized rows beyond the new m must not reach its outputs,
// so the result is bit-identical to the same call made before the large one.
TEST(MatMulAmxScratchTest, SmallerCallAfterLargerIsUnchanged) {
  if (!cpu::MatMulHasAmx()) GTEST_SKIP() << kNoAmxMessage;
  UseAmxInt8 int8;
  for (GgmlType t : {GgmlType::kQ4_1, GgmlType::kQ8_0}) {
    const int64_t n = 33, k = 96;
    const size_t row_bytes = RowBytes(t, k);
    const auto w = MakeWeights(t, n, k, row_bytes, 9);
    auto big = HiddenStates(64, k, k, 10);
    for (float& v : big) v *= 1e4f;  // large stale values
    const auto small = HiddenStates(17, k, k, 11);
    std::vector<float> before(17 * n), after(17 * n), y_big(64 * n);
    cpu::MatMul(small.data(), 17, k, k, w.data(), t, n, row_bytes, before.data(), n);
    cpu::MatMul(big.data(), 64, k, k, w.data(), t, n, row_bytes, y_big.data(), n);
    cpu::MatMul(small.data(), 17, k, k, w.data(), t, n, row_bytes, after.data(), n);
    EXPECT_EQ(std::memcmp(before.data(), after.data(), before.size() * sizeof(float)), 0)
        << GetTypeTraits(t).name;
  }
}

// The tile path's activation quantizer (16 blocks at a time) is bit-identical
// to ggml's reference quantizers: values, fp16 d and Q8_1's fp16 s. Inputs
// cover random rows, all-zero blocks, exact .5 ties after scaling (amax 127
// gives d = 1), tiny blocks (d below fp16's subnormal range), huge values,
// and block counts below, at and off multiples of 16.
TEST(MatMulAmxQuantizeTest, MatchesRefQ8_0AndQ8_1BitForBit) {
  if (!cpu::MatMulHasAmx()) GTEST_SKIP() << kNoAmxMessage;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int64_t k : {32, 64, 512, 544, 576, 1536}) {
    const int64_t nb = k / 32;
    for (int variant = 0; variant < 4; ++variant) {
      std::vector<float> x(k);
      for (int64_t i = 0; i < k; ++i) x[i] = nd(rng) * (i % 97 == 5 ? 20.0f : 1.0f);
      for (int64_t b = 0; b < nb; ++b) {
        float* xb = x.data() + 32 * b;
        switch ((b + variant) % 6) {
          case 0: std::fill(xb, xb + 32, 0.0f); break;
          case 1:  // amax 127: d = 1 exactly, q = roundf(x) with ties
            for (int j = 0; j < 32; ++j) xb[j] = static_cast<float>(j - 16) + 0.5f;
            xb[5] = -127.0f;
            break;
          case 2:
            for (int j = 0; j < 32; ++j) xb[j] *= 1e-9f;  // d ~ 1e-11: fp16 0
            break;
          case 3:
            for (int j = 0; j < 32; ++j) xb[j] *= 1e6f;  // d near or beyond fp16's largest value
            break;
          default: break;
        }
      }
      std::vector<BlockQ8_1> r1(nb);
      std::vector<BlockQ8_0> r0(nb);
      ref::QuantizeRowQ8_1(x.data(), r1.data(), k);
      ref::QuantizeRowQ8_0(x.data(), r0.data(), k);
      constexpr int64_t kQStride = 48, kSStride = 3;
      std::vector<uint8_t> q(nb * kQStride, 0xAA);
      std::vector<float> dx(nb * kSStride, -1.0f), sx(nb * kSStride, -1.0f);
      cpu::internal::QuantizeRowQ8Tiles(x.data(), k, q.data(), kQStride, dx.data(), sx.data(), kSStride);
      for (int64_t b = 0; b < nb; ++b) {
        SCOPED_TRACE(::testing::Message() << "k=" << k << " variant=" << variant << " block=" << b);
        ASSERT_EQ(std::memcmp(q.data() + b * kQStride, r1[b].qs, 32), 0);
        ASSERT_EQ(std::memcmp(r0[b].qs, r1[b].qs, 32), 0);  // Q8_0 and Q8_1 share values and d
        for (int j = 32; j < kQStride; ++j) ASSERT_EQ(q[b * kQStride + j], 0xAA) << "wrote past the block";
        // Compare bit patterns (covers ±0 and inf).
        const float d_ref = Fp16ToFp32(r1[b].d), s_ref = Fp16ToFp32(r1[b].s);
        ASSERT_EQ(std::memcmp(&dx[b * kSStride], &d_ref, 4), 0) << dx[b * kSStride] << " vs " << d_ref;
        ASSERT_EQ(std::memcmp(&sx[b * kSStride], &s_ref, 4), 0) << sx[b * kSStride] << " vs " << s_ref;
        ASSERT_EQ(r0[b].d, r1[b].d);
      }
    }
  }
}

}  // namespace
}  // namespace snapfill
