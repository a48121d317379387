// The decode layout (kernels/quant_blocks.h) and the one-token product over
// it, cpu::MatMulDecodePacked:
//  - cpu::PackForDecode, read back by ref::UnpackDecodeLayout, gives the
//    original rows byte for byte (and zero-padded rows in the last group);
//  - so ref::MatMulDecodePacked, the scalar twin, equals ggml's arithmetic
//    on the original rows (ref::MatMulQuantizedActivations) bit for bit;
//  - cpu::MatMulDecodePacked equals the twin up to f32 summation order:
//    each lane sums at most 2·k/32 + 1 rounded terms, inside the bound
//    (k/16 + 64) · 2^-24 · Σ|terms| that matmul_test.cc uses;
//  - it is the same on 1 and 2 threads and writes exactly n outputs.
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/matmul.h"
#include "kernels/quant_blocks.h"
#include "kernels/ref/quant_ref.h"
#include "tests/testing/matmul_data.h"

namespace snapfill {
namespace {

struct Case {
  GgmlType type;
  int64_t n, k;
};

std::string CaseName(const Case& c) {
  std::ostringstream os;
  os << GetTypeTraits(c.type).name << "_n" << c.n << "_k" << c.k;
  return os.str();
}

void PrintTo(const Case& c, std::ostream* os) { *os << CaseName(c); }

class MatMulDecodeTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (cpu::DecodePackedBytes(GetParam().type, GetParam().n, GetParam().k) == 0) {
      GTEST_SKIP() << "no decode-layout kernel in this build (AVX-512 VNNI or AVX2)";
    }
  }
};

std::vector<uint8_t> Pack(const Case& c, const std::vector<uint8_t>& w, size_t row_bytes) {
  std::vector<uint8_t> packed(cpu::DecodePackedBytes(c.type, c.n, c.k), 0xAB);
  cpu::PackForDecode(w.data(), c.type, c.n, c.k, row_bytes, packed.data());
  return packed;
}

TEST_P(MatMulDecodeTest, LayoutReadsBackAsTheRows) {
  const Case c = GetParam();
  const size_t row_bytes = RowBytes(c.type, c.k) + 6;  // a padded stride
  const auto w = testing::QuantizedWeights(c.type, c.n, c.k, row_bytes, 3 + c.n, 0.02f);
  const auto packed = Pack(c, w, row_bytes);
  const int64_t groups = (c.n + kDecodeGroupRows - 1) / kDecodeGroupRows;
  ASSERT_EQ(packed.size(), static_cast<size_t>(groups * (c.k / 32) * DecodeRecordBytes(c.type)));

  std::vector<uint8_t> back(w.size(), 0xEE);  // QuantizedWeights pads with 0xEE too
  ASSERT_TRUE(ref::UnpackDecodeLayout(packed.data(), c.type, c.n, c.k, back.data(), row_bytes));
  EXPECT_EQ(back, w);

  // The padding rows of the last group read back as zero blocks.
  const int64_t all = groups * kDecodeGroupRows;
  std::vector<uint8_t> padded(all * RowBytes(c.type, c.k), 0xEE);
  ASSERT_TRUE(ref::UnpackDecodeLayout(packed.data(), c.type, all, c.k, padded.data(), RowBytes(c.type, c.k)));
  for (size_t i = c.n * RowBytes(c.type, c.k); i < padded.size(); ++i) ASSERT_EQ(padded[i], 0) << i;
}

TEST_P(MatMulDecodeTest, MatchesTheTwinAndGgmlArithmetic) {
  const Case c = GetParam();
  const size_t row_bytes = RowBytes(c.type, c.k);
  const auto w = testing::QuantizedWeights(c.type, c.n, c.k, row_bytes, 11 + c.n, 0.02f);
  const auto x = testing::HiddenStates(1, c.k, c.k, 7 + c.k);
  const auto packed = Pack(c, w, row_bytes);

  std::vector<float> twin(c.n), ggml(c.n);
  std::vector<double> abs_terms(c.n);
  ASSERT_TRUE(ref::MatMulDecodePacked(x.data(), c.k, packed.data(), c.type, c.n, twin.data(), abs_terms.data()));
  ASSERT_TRUE(ref::MatMulQuantizedActivations(x.data(), 1, c.k, c.k, w.data(), c.type, c.n, row_bytes,
                                              ggml.data(), c.n));
  for (int64_t j = 0; j < c.n; ++j) ASSERT_EQ(twin[j], ggml[j]) << "row " << j;

  const float kSentinel = -12345.0f;
  std::vector<float> y(c.n + 16, kSentinel);
  cpu::MatMulDecodePacked(x.data(), c.k, packed.data(), c.type, c.n, y.data());
  const double sum_n = static_cast<double>(c.k) / 16.0 + 64.0;
  int64_t bad = 0;
  for (int64_t j = 0; j < c.n; ++j) {
    const double tol = sum_n * 0x1p-24 * abs_terms[j];
    if (!(std::fabs(static_cast<double>(y[j]) - twin[j]) <= tol)) {
      if (++bad <= 5) ADD_FAILURE() << "row " << j << ": twin " << twin[j] << " cpu " << y[j] << " tol " << tol;
    }
  }
  EXPECT_EQ(bad, 0);
  for (int64_t j = c.n; j < c.n + 16; ++j) EXPECT_EQ(y[j], kSentinel) << "wrote past n at " << j;
}

// Runs `first`, then `second`, on one packed matrix and token; true if the
// two results are the same bits.
template <class F, class G>
bool SameBits(const Case& c, uint64_t seed, F first, G second) {
  const size_t row_bytes = RowBytes(c.type, c.k);
  const auto w = testing::QuantizedWeights(c.type, c.n, c.k, row_bytes, seed, 0.02f);
  const auto x = testing::HiddenStates(1, c.k, c.k, seed + 4);
  const auto packed = Pack(c, w, row_bytes);
  std::vector<float> y1(c.n), y2(c.n);
  first();
  cpu::MatMulDecodePacked(x.data(), c.k, packed.data(), c.type, c.n, y1.data());
  second();
  cpu::MatMulDecodePacked(x.data(), c.k, packed.data(), c.type, c.n, y2.data());
  return std::memcmp(y1.data(), y2.data(), c.n * sizeof(float)) == 0;
}

TEST_P(MatMulDecodeTest, OneThreadEqualsTwo) {
  const int before = omp_get_max_threads();
  EXPECT_TRUE(SameBits(GetParam(), 5, [] { omp_set_num_threads(1); }, [] { omp_set_num_threads(2); }));
  omp_set_num_threads(before);
}

// The AVX2 kernel of the layout (kAuto's where the CPU has no AVX-512) gives
// the AVX-512 kernel's results bit for bit: the same exact integer block
// dots, the scales applied in the same order.
TEST_P(MatMulDecodeTest, Avx2KernelEqualsTheDefaultBitForBit) {
  EXPECT_TRUE(SameBits(GetParam(), 11, [] {}, [] { cpu::SetMatMulImplForTesting(cpu::MatMulImpl::kAvx2); }));
  cpu::SetMatMulImplForTesting(cpu::MatMulImpl::kAuto);
}

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  for (GgmlType t : {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ8_0}) {
    // One row, a partial group, several groups with a partial last one, and
    // one block per row.
    for (int64_t n : {1, 16, 17, 203}) cases.push_back({t, n, 96});
    cases.push_back({t, 40, 32});
  }
  // The default model's decode shapes: layers (Q4_1) and the output head
  // (Q8_0), large enough to run on both threads.
  cases.push_back({GgmlType::kQ4_1, 192, 576});
  cases.push_back({GgmlType::kQ4_1, 1536, 576});
  cases.push_back({GgmlType::kQ4_1, 576, 1536});
  cases.push_back({GgmlType::kQ8_0, 4099, 576});
  // Gemma 3 270M's Q5_0 products (Q, K, gate and up) and its head's k.
  cases.push_back({GgmlType::kQ5_0, 1024, 640});
  cases.push_back({GgmlType::kQ5_0, 2048, 640});
  cases.push_back({GgmlType::kQ8_0, 4099, 640});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Cpu, MatMulDecodeTest, ::testing::ValuesIn(AllCases()),
                         [](const auto& info) { return CaseName(info.param); });

// MatMulDecodePackedShared: several packed weights of one type times one
// token, each thread's span of groups running from one matrix into the next.
// Every output equals MatMulDecodePacked's for that weight alone, bit for
// bit, on 1 and 2 threads; nothing past any n is written. The shapes: Q, K
// and V of the default model, then one partial group between two others
// (spans that start and end inside a matrix), then products too small for
// two threads.
TEST(MatMulDecodePackedSharedTest, EqualsOneProductEachBitForBit) {
  const int before = omp_get_max_threads();
  const float kSentinel = -12345.0f;
  int ran = 0;
  for (GgmlType t : {GgmlType::kQ4_1, GgmlType::kQ4_0, GgmlType::kQ5_0, GgmlType::kQ8_0}) {
    for (const std::vector<int64_t>& ns : {std::vector<int64_t>{576, 192, 192}, std::vector<int64_t>{203, 5, 1536},
                                           std::vector<int64_t>{16, 17}}) {
      const int64_t k = ns.size() == 2 ? 64 : 576;
      if (cpu::DecodePackedBytes(t, ns[0], k) == 0) continue;  // (no kernel for the type here)
      ++ran;
      const auto x = testing::HiddenStates(1, k, k, 31 + k);
      std::vector<std::vector<uint8_t>> packed;
      std::vector<std::vector<float>> alone;
      for (size_t c = 0; c < ns.size(); ++c) {
        const Case one{t, ns[c], k};
        packed.push_back(Pack(one, testing::QuantizedWeights(t, ns[c], k, RowBytes(t, k), 40 + c, 0.02f),
                              RowBytes(t, k)));
        alone.emplace_back(ns[c]);
        cpu::MatMulDecodePacked(x.data(), k, packed[c].data(), t, ns[c], alone[c].data());
      }
      for (int threads : {1, 2}) {
        omp_set_num_threads(threads);
        std::vector<std::vector<float>> y;
        std::vector<cpu::DecodeOut> outs;
        for (size_t c = 0; c < ns.size(); ++c) y.emplace_back(ns[c] + 16, kSentinel);
        for (size_t c = 0; c < ns.size(); ++c) outs.push_back({packed[c].data(), ns[c], y[c].data()});
        cpu::MatMulDecodePackedShared(x.data(), k, t, outs.data(), static_cast<int>(outs.size()));
        for (size_t c = 0; c < ns.size(); ++c) {
          EXPECT_EQ(std::memcmp(y[c].data(), alone[c].data(), ns[c] * sizeof(float)), 0)
              << GetTypeTraits(t).name << " product " << c << " of n " << ns[c] << ", " << threads << " threads";
          for (int64_t j = ns[c]; j < ns[c] + 16; ++j) {
            ASSERT_EQ(y[c][j], kSentinel) << "product " << c << " wrote past n at " << j;
          }
        }
      }
    }
  }
  omp_set_num_threads(before);
  if (ran == 0) GTEST_SKIP() << "no decode-layout kernel in this build";
}

TEST(MatMulDecodePackedBytes, CoversOnlyItsTypesAndWholeBlocks) {
  EXPECT_EQ(cpu::DecodePackedBytes(GgmlType::kQ4_K, 16, 256), 0u);
  EXPECT_EQ(cpu::DecodePackedBytes(GgmlType::kF32, 16, 64), 0u);
  EXPECT_EQ(cpu::DecodePackedBytes(GgmlType::kQ8_0, 16, 48), 0u);
  EXPECT_EQ(cpu::DecodePackedBytes(GgmlType::kQ8_0, 0, 64), 0u);
  if (cpu::MatMulHasDecodeLayout()) {
    // Every type of the layout has records wherever the layout is read, on
    // the AVX-512 kernels as on the AVX2 ones (Q5_0 took its rows in place
    // on AVX-512 before it had a kernel there).
    for (cpu::MatMulImpl impl : {cpu::MatMulImpl::kAuto, cpu::MatMulImpl::kAvx2}) {
      cpu::SetMatMulImplForTesting(impl);
      EXPECT_EQ(cpu::DecodePackedBytes(GgmlType::kQ4_1, 17, 64), 2u * 2u * 320u);
      EXPECT_EQ(cpu::DecodePackedBytes(GgmlType::kQ4_0, 17, 64), 2u * 2u * 320u);
      EXPECT_EQ(cpu::DecodePackedBytes(GgmlType::kQ5_0, 17, 64), 2u * 2u * 352u) << cpu::ProductPathName(impl);
      EXPECT_EQ(cpu::DecodePackedBytes(GgmlType::kQ8_0, 17, 64), 2u * 2u * 544u);
    }
    cpu::SetMatMulImplForTesting(cpu::MatMulImpl::kGeneric);
    EXPECT_EQ(cpu::DecodePackedBytes(GgmlType::kQ4_1, 17, 64), 0u);
    cpu::SetMatMulImplForTesting(cpu::MatMulImpl::kAuto);
  }
}

}  // namespace
}  // namespace snapfill
